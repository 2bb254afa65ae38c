//! Server-sent events cut out of a byte stream as its chunks arrive.
//!
//! A provider's chunks follow its writes and the network, not its events: an event may end in
//! the chunk after the one it began in, or many chunks later (a Responses `response.completed`
//! event repeats the whole answer). [`EventSplitter`] hands out each event whole, once its
//! blank line has come, and holds only the unfinished one. Each byte is searched for an event's
//! end once: an event arriving in `n` chunks costs what its length costs, not `n` times it.

use bytes::{Bytes, BytesMut};

/// The most bytes of an unfinished event held back while waiting for its end.
pub const MAX_HELD_EVENT_BYTES: usize = 1 << 20;

/// Cuts events out of the chunks fed to it, in order.
#[derive(Default)]
pub struct EventSplitter {
    /// The start of an event whose end has not come yet. It never holds a whole event.
    held: BytesMut,
}

impl EventSplitter {
    /// Calls `each_event` with every event `chunk` completes (its blank line included), in
    /// order. Returns the held event's bytes when it has outgrown [`MAX_HELD_EVENT_BYTES`]:
    /// they are let go as they are, and the rest of that event, up to its blank line, comes
    /// out later as an event of its own.
    pub fn feed(&mut self, chunk: &[u8], mut each_event: impl FnMut(&[u8])) -> Option<Bytes> {
        let mut rest = chunk;
        if !self.held.is_empty() {
            let Some(end) = self.end_after_held(chunk) else {
                if self.held.len() + chunk.len() > MAX_HELD_EVENT_BYTES {
                    // Let go of what is held along with this chunk, rather than grow.
                    let mut overlong = std::mem::take(&mut self.held);
                    overlong.extend_from_slice(chunk);
                    return Some(overlong.freeze());
                }
                self.held.extend_from_slice(chunk);
                return None;
            };
            self.held.extend_from_slice(&chunk[..end]);
            each_event(&self.held);
            self.held.clear();
            rest = &chunk[end..];
        }
        // Whole events inside the chunk are read where they lie, without a copy.
        while let Some(end) = find_event_end(rest) {
            each_event(&rest[..end]);
            rest = &rest[end..];
        }
        self.held.extend_from_slice(rest);
        if self.held.len() > MAX_HELD_EVENT_BYTES {
            return Some(self.held.split().freeze());
        }
        None
    }

    /// The unfinished event, at the end of the stream (a last event without its blank line).
    pub fn finish(&mut self) -> Option<Bytes> {
        (!self.held.is_empty()).then(|| self.held.split().freeze())
    }

    /// Where in `chunk` the held event ends: a blank line may begin in the held bytes (at most
    /// their last three, since they hold no whole one) and end in the chunk.
    fn end_after_held(&self, chunk: &[u8]) -> Option<usize> {
        let tail = &self.held[self.held.len().saturating_sub(3)..];
        let mut seam = [0u8; 6];
        let head = &chunk[..chunk.len().min(3)];
        seam[..tail.len()].copy_from_slice(tail);
        seam[tail.len()..tail.len() + head.len()].copy_from_slice(head);
        match find_event_end(&seam[..tail.len() + head.len()]) {
            Some(end) => Some(end - tail.len()),
            None => find_event_end(chunk),
        }
    }
}

/// The end (exclusive, the blank line included) of the first whole event in `bytes`: the first
/// `\n\n` or `\r\n\r\n`, whichever ends first.
pub fn find_event_end(bytes: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', bytes).find_map(|at| match bytes.get(at + 1) {
        Some(b'\n') => Some(at + 2),
        Some(b'\r') if at > 0 && bytes[at - 1] == b'\r' && bytes.get(at + 2) == Some(&b'\n') => {
            Some(at + 3)
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition: the earlier end of the first `\n\n` and of the first `\r\n\r\n`.
    fn first_end_by_definition(bytes: &[u8]) -> Option<usize> {
        let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
        let crlf = bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|p| p + 4);
        match (lf, crlf) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Feeds `chunks`, returning the events and what was let go, as they came out.
    fn split(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut splitter = EventSplitter::default();
        let mut out = Vec::new();
        for chunk in chunks {
            let let_go = splitter.feed(chunk, |event| out.push(event.to_vec()));
            out.extend(let_go.map(|b| b.to_vec()));
        }
        out.extend(splitter.finish().map(|b| b.to_vec()));
        out
    }

    proptest! {
        #[test]
        fn the_end_found_is_the_definitions(bytes in proptest::collection::vec(
            prop::sample::select(vec![b'\n', b'\r', b'a']), 0..24)) {
            prop_assert_eq!(find_event_end(&bytes), first_end_by_definition(&bytes));
        }

        /// However a stream is cut into chunks, the same events come out, whole.
        #[test]
        fn events_come_out_whole_wherever_the_chunks_are_cut(
            events in proptest::collection::vec(
                ("[a-z:{} ]{0,12}", prop::bool::ANY), 1..6),
            cuts in proptest::collection::vec(0usize..200, 0..6),
        ) {
            let whole: Vec<Vec<u8>> = events
                .iter()
                .map(|(data, crlf)| {
                    let end = if *crlf { "\r\n\r\n" } else { "\n\n" };
                    format!("data: {data}{end}").into_bytes()
                })
                .collect();
            let stream = whole.concat();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (stream.len() + 1)).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for cut in cuts.into_iter().chain([stream.len()]) {
                chunks.push(&stream[start..cut]);
                start = cut;
            }
            prop_assert_eq!(split(&chunks), whole);
        }
    }

    #[test]
    fn a_blank_line_split_across_chunks_ends_its_event() {
        for stream in [
            &b"data: 1\r\n\r\ndata: 2\n\n"[..],
            b"data: 1\n\ndata: 2\r\n\r\n",
        ] {
            for cut in 0..=stream.len() {
                let (a, b) = stream.split_at(cut);
                let events = split(&[a, b]);
                assert_eq!(events.concat(), stream, "cut at {cut}");
                assert_eq!(events.len(), 2, "cut at {cut}: {events:?}");
            }
        }
    }

    #[test]
    fn an_event_too_long_to_hold_is_let_go_and_its_rest_comes_after() {
        let mut splitter = EventSplitter::default();
        let mut events = Vec::new();
        let start = b"data: ".to_vec();
        assert!(splitter.feed(&start, |e| events.push(e.to_vec())).is_none());
        let long = vec![b'x'; MAX_HELD_EVENT_BYTES];
        let let_go = splitter.feed(&long, |e| events.push(e.to_vec()));
        assert_eq!(let_go.map(|b| b.len()), Some(start.len() + long.len()));
        splitter.feed(b"yy\n\ndata: next\n\n", |e| events.push(e.to_vec()));
        assert_eq!(events, vec![b"yy\n\n".to_vec(), b"data: next\n\n".to_vec()]);
        assert!(splitter.finish().is_none());
    }
}
