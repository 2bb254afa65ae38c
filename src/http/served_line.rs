//! The log line of a served request, the one line every request writes.
//!
//! Users parse it, so its text is the general formatter's, byte for byte: timestamp, level,
//! target, message, then `key=value` fields in a fixed order. Through the formatter it cost
//! 0.95 µs (the subscriber's field visitor and `core::fmt` for each of its twelve fields) of a
//! request's 30 µs of CPU at saturation; written here, 0.21 µs (`cargo bench --bench pipeline
//! -- served_log_line`; benches/results/2026-12-05-served-line.md). That is done only where
//! the result is the same: the plain text format without colours, outside any span (a named
//! tenant's, whose name the formatter puts before the target). Everywhere else the line goes through
//! `tracing` as any other; a filter that leaves out info for this target leaves it out either
//! way.

use std::cell::Cell;
use std::io::Write as _;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use super::log::Escaped;
use crate::log_writer::BatchedLog;

/// The target the line has always had: filters name it (`COMPACTOR_LOG=compactor::http=warn`).
const TARGET: &str = "compactor::http::exchange::closing";

/// Where lines written here go, set when logging starts in the plain text format.
static PLAIN_OUTPUT: OnceLock<BatchedLog> = OnceLock::new();

/// Lets [`log`] write the line itself into `output`, the same log the formatter writes to.
/// Only for the text format without colours.
pub fn write_plain_lines_to(output: BatchedLog) {
    let _ = PLAIN_OUTPUT.set(output);
}

/// What the line says of a served request.
pub struct ServedLine<'a> {
    pub dialect: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub model: &'a str,
    pub prompt_tokens: u64,
    pub tokens_sent: u64,
    pub compacted: bool,
    /// The conversation's anchor, shortened, or `-`.
    pub conversation: &'a str,
    /// The checkpoint applied, or `-`.
    pub checkpoint: &'a str,
    pub upstream_ms: u64,
    pub summary_ms: u64,
    /// Written as milliseconds with up to three decimals, as the `x-compactor-overhead-ms`
    /// header gives it.
    pub overhead_us: u64,
}

/// Logs `line` at info.
pub fn log(line: &ServedLine<'_>) {
    match PLAIN_OUTPUT.get() {
        Some(output)
            if tracing::Span::current().is_none()
                && tracing::enabled!(target: TARGET, tracing::Level::INFO) =>
        {
            let now = SystemTime::now();
            // The log writer only fails when its output does, which the formatter ignores too.
            let _ = output.append_with(|lines| format_plain(line, now, lines));
        }
        _ => tracing::info!(
            target: TARGET,
            method = "POST",
            path = line.path,
            status = line.status,
            model = %Escaped(line.model),
            prompt_tokens = line.prompt_tokens,
            tokens_sent = line.tokens_sent,
            compacted = line.compacted,
            conversation = line.conversation,
            checkpoint = line.checkpoint,
            upstream_ms = line.upstream_ms,
            summary_ms = line.summary_ms,
            overhead_ms = line.overhead_us as f64 / 1000.0,
            "Served a {} request.",
            line.dialect
        ),
    }
}

/// The line as the text formatter writes it without colours, at `now`, newline included.
fn format_plain(line: &ServedLine<'_>, now: SystemTime, out: &mut Vec<u8>) {
    write_timestamp(now, out);
    out.extend_from_slice(b"  INFO ");
    out.extend_from_slice(TARGET.as_bytes());
    out.extend_from_slice(b": Served a ");
    out.extend_from_slice(line.dialect.as_bytes());
    out.extend_from_slice(b" request. method=\"POST\" path=");
    write_quoted(line.path, out);
    out.extend_from_slice(b" status=");
    write_integer(line.status.into(), out);
    out.extend_from_slice(b" model=");
    write_model(line.model, out);
    out.extend_from_slice(b" prompt_tokens=");
    write_integer(line.prompt_tokens, out);
    out.extend_from_slice(b" tokens_sent=");
    write_integer(line.tokens_sent, out);
    out.extend_from_slice(if line.compacted {
        b" compacted=true conversation="
    } else {
        b" compacted=false conversation="
    });
    write_quoted(line.conversation, out);
    out.extend_from_slice(b" checkpoint=");
    write_quoted(line.checkpoint, out);
    out.extend_from_slice(b" upstream_ms=");
    write_integer(line.upstream_ms, out);
    out.extend_from_slice(b" summary_ms=");
    write_integer(line.summary_ms, out);
    out.extend_from_slice(b" overhead_ms=");
    write_milliseconds(line.overhead_us, out);
    out.push(b'\n');
}

/// The model as [`Escaped`] shows it. A name of printable ASCII without `=` or `"` (every
/// provider's) is shown as it is, spared `core::fmt` and a copy.
fn write_model(model: &str, out: &mut Vec<u8>) {
    let plain = model.len() <= super::log::MAX_LOGGED_CHARS
        && model
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'=' && b != b'"');
    if plain {
        out.extend_from_slice(model.as_bytes());
    } else {
        let _ = write!(out, "{}", Escaped(model));
    }
}

/// `micros` as milliseconds, as the formatter writes the float `micros / 1000`: its shortest
/// decimal (`0.064`, `0.12`), with `.0` when whole. Written from integers: a float's formatting
/// was a third of the line's cost.
fn write_milliseconds(micros: u64, out: &mut Vec<u8>) {
    super::headers::write_milliseconds(micros, out);
    // The float's shortest text: the trailing zeros of the three decimals dropped, one kept.
    while out.ends_with(b"0") && !out.ends_with(b".0") {
        out.pop();
    }
}

fn write_integer(value: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// A string field as the formatter writes it: in quotes, escaped as `Debug` escapes. Ids, hex
/// and paths have nothing to escape; anything else takes `Debug` itself.
fn write_quoted(value: &str, out: &mut Vec<u8>) {
    let plain = value
        .bytes()
        .all(|b| (b.is_ascii_graphic() && b != b'"' && b != b'\\') || b == b' ');
    if plain {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        let _ = write!(out, "{value:?}");
    }
}

thread_local! {
    /// The second last written, and its `YYYY-MM-DDTHH:MM:SS`: lines come many to a second.
    static LAST_SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

/// `now` in UTC as the formatter writes it: RFC 3339 with microseconds and `Z`.
fn write_timestamp(now: SystemTime, out: &mut Vec<u8>) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs();
    let (cached, mut text) = LAST_SECOND.get();
    if cached != seconds {
        text = date_and_time(seconds);
        LAST_SECOND.set((seconds, text));
    }
    out.extend_from_slice(&text);
    let mut fraction = *b".000000Z";
    put_digits(&mut fraction[1..7], since.subsec_micros().into());
    out.extend_from_slice(&fraction);
}

/// `YYYY-MM-DDTHH:MM:SS` of `seconds` after the Unix epoch, in UTC (years 1970 to 9999).
fn date_and_time(seconds: u64) -> [u8; 19] {
    let days = seconds / 86_400;
    let in_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    let mut text = [0u8; 19];
    for (range, value) in [
        (0..4, year),
        (5..7, month),
        (8..10, day),
        (11..13, in_day / 3600),
        (14..16, in_day / 60 % 60),
        (17..19, in_day % 60),
    ] {
        put_digits(&mut text[range], value);
    }
    for (at, separator) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')] {
        text[at] = separator;
    }
    text
}

/// `value`'s last `into.len()` decimal digits, zero-padded, into `into`.
fn put_digits(into: &mut [u8], mut value: u64) {
    for digit in into.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// Year, month and day of `days` after 1970-01-01: the proleptic Gregorian calendar counted
/// in 400-year eras that start on March 1st, so the leap day ends a year.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let shifted = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn dates_are_the_calendar_s() {
        for (seconds, expected) in [
            (0, "1970-01-01T00:00:00"),
            (951_782_399, "2000-02-28T23:59:59"),
            (951_782_400, "2000-02-29T00:00:00"),
            (1_709_251_199, "2024-02-29T23:59:59"),
            (1_733_390_712, "2024-12-05T09:25:12"),
            (4_102_444_799, "2099-12-31T23:59:59"),
        ] {
            assert_eq!(
                std::str::from_utf8(&date_and_time(seconds)).unwrap(),
                expected
            );
        }
        let mut out = Vec::new();
        write_timestamp(UNIX_EPOCH + Duration::new(951_782_400, 7_000), &mut out);
        assert_eq!(out, b"2000-02-29T00:00:00.000007Z");
    }

    /// What the formatter writes, captured.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_line_is_the_formatter_s_byte_for_byte() {
        let cases = [
            ServedLine {
                dialect: "chat",
                path: "/v1/chat/completions",
                status: 200,
                model: "gpt-4o-mini",
                prompt_tokens: 1_234,
                tokens_sent: 987,
                compacted: true,
                conversation: "0123456789abcdef",
                checkpoint: "9f86d081884c7d65",
                upstream_ms: 1_523,
                summary_ms: 0,
                overhead_us: 64,
            },
            ServedLine {
                dialect: "messages",
                path: "/v1/messages",
                status: 529,
                model: "x compacted=true\n\u{1b}[31m",
                prompt_tokens: 0,
                tokens_sent: u64::MAX,
                compacted: false,
                conversation: "-",
                checkpoint: "a \"quoted\" \\ id\té",
                upstream_ms: 0,
                summary_ms: 61_000,
                overhead_us: 1_000,
            },
        ];
        for line in &cases {
            let captured = Captured::default();
            let writer = captured.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            let before = SystemTime::now();
            tracing::subscriber::with_default(subscriber, || log(line));
            let after = SystemTime::now();
            let theirs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
            let [mut earliest, mut latest] = [Vec::new(), Vec::new()];
            format_plain(line, before, &mut earliest);
            format_plain(line, after, &mut latest);
            let (earliest, latest) = (
                String::from_utf8(earliest).unwrap(),
                String::from_utf8(latest).unwrap(),
            );
            // The same text after the timestamp; the timestamp of a moment between the two (of
            // fixed width, RFC 3339 text sorts as time does).
            let stamp = "2000-01-01T00:00:00.000000Z".len();
            assert_eq!(theirs.len(), earliest.len(), "{theirs}{earliest}");
            assert_eq!(theirs[stamp..], earliest[stamp..]);
            assert!(earliest[..stamp] <= theirs[..stamp] && theirs[..stamp] <= latest[..stamp]);
        }
    }

    #[test]
    fn milliseconds_are_the_float_s_shortest_text() {
        let micros = (0..20_000)
            .chain((0..2_000_000).step_by(997))
            .chain([u64::from(u32::MAX), 9_007_199_254_740]);
        for micros in micros {
            let mut out = Vec::new();
            write_milliseconds(micros, &mut out);
            let float = format!("{:?}", micros as f64 / 1000.0);
            assert_eq!(String::from_utf8(out).unwrap(), float, "{micros} µs");
        }
    }

    #[test]
    fn a_model_is_shown_as_escaped_shows_it() {
        for model in [
            "gpt-4o-mini",
            "claude-sonnet-4-5@20250929",
            "org/model:Q4_K_M",
            r"back\slash",
            "",
            "with space",
            "a=b",
            "say \"x\"",
            "tab\t",
            "é",
            &"m".repeat(super::super::log::MAX_LOGGED_CHARS + 1),
        ] {
            let mut out = Vec::new();
            write_model(model, &mut out);
            let escaped = Escaped(model).to_string();
            assert_eq!(String::from_utf8(out).unwrap(), escaped, "{model:?}");
        }
    }
}
