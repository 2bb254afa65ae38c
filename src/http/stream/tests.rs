//! The observer's tests: usage read from JSON and SSE answers however they are cut, the
//! usage-only event removed only where the proxy asked for it, and silences ended.

use super::*;
use crate::dialect::chat::Chat;
use crate::http::sse_events::MAX_HELD_EVENT_BYTES;
use futures::StreamExt;
use std::sync::{Arc, Mutex};

fn source(chunks: &[&'static str]) -> ByteStream {
    let items: Vec<Result<Bytes, std::io::Error>> = chunks
        .iter()
        .map(|c| Ok(Bytes::from_static(c.as_bytes())))
        .collect();
    Box::pin(futures::stream::iter(items))
}

async fn run(observed: Observed) -> String {
    let parts: Vec<Bytes> = observed.map(|c| c.unwrap()).collect().await;
    String::from_utf8(parts.concat()).unwrap()
}

/// A sink that keeps the prompt size reported.
fn sink() -> (UsageSink, Arc<Mutex<Option<u64>>>) {
    let seen = Arc::new(Mutex::new(None));
    let s = seen.clone();
    (
        Box::new(move |u: Usage| *s.lock().unwrap() = u.input_tokens),
        seen,
    )
}

/// A sink that keeps the whole usage, once it is called.
fn usage_sink() -> (UsageSink, Arc<Mutex<Option<Usage>>>) {
    let seen = Arc::new(Mutex::new(None));
    let s = seen.clone();
    (Box::new(move |u| *s.lock().unwrap() = Some(u)), seen)
}

const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":42}}\n\n";

#[tokio::test]
async fn strips_the_usage_event_it_added() {
    let (s, seen) = sink();
    let out = run(Observed::sse(
        source(&[
            "data: {\"choices\":[{\"delta\":{}}]}\n",
            "\ndata: {\"choi",
            "ces\":[],\"usage\":{\"prompt_tokens\":42}}\n\n",
            "data: [DONE]\n\n",
        ]),
        true,
        &Chat,
        s,
    ))
    .await;
    assert_eq!(
        out,
        "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n"
    );
    assert_eq!(*seen.lock().unwrap(), Some(42));
}

#[tokio::test]
async fn an_event_that_does_not_end_is_not_held_without_bound() {
    let (s, _) = sink();
    let start = "data: {\"choices\":[{\"delta\":{\"content\":\"";
    let long = "x".repeat(MAX_HELD_EVENT_BYTES);
    let sent = [Bytes::from_static(start.as_bytes()), Bytes::from(long)];
    let total: usize = sent.iter().map(Bytes::len).sum();
    // The event's end never comes: the provider goes quiet.
    let quiet = futures::stream::iter(sent.map(Ok)).chain(futures::stream::pending());
    let mut observed = Observed::sse(Box::pin(quiet), true, &Chat, s);
    let mut forwarded = Vec::new();
    while forwarded.len() < total {
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), observed.next())
            .await
            .expect("held back while waiting for the event's end");
        forwarded.extend_from_slice(&next.unwrap().unwrap());
    }
    assert_eq!(&forwarded[..start.len()], start.as_bytes());
    assert_eq!(forwarded.len(), total);
}

#[tokio::test]
async fn keeps_usage_the_client_asked_for() {
    let (s, seen) = sink();
    let input = ["data: {\"choices\":[{}]}\n\n", USAGE, "data: [DONE]\n\n"];
    let out = run(Observed::sse(source(&input), false, &Chat, s)).await;
    assert_eq!(out, input.concat());
    assert_eq!(*seen.lock().unwrap(), Some(42));
}

#[tokio::test]
async fn reads_usage_of_json_bodies() {
    let (s, seen) = sink();
    let out = run(Observed::json(
        source(&["{\"choices\":[],", "\"usage\":{\"prompt_tokens\":7}}"]),
        &Chat,
        s,
    ))
    .await;
    assert_eq!(out, "{\"choices\":[],\"usage\":{\"prompt_tokens\":7}}");
    assert_eq!(*seen.lock().unwrap(), Some(7));
}

#[tokio::test]
async fn reads_usage_in_the_answers_dialect() {
    use crate::dialect::{anthropic::Messages, responses::Responses};
    let (s, seen) = sink();
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":90,\"cache_creation_input_tokens\":10}}}\n\n";
    let input = [
        start,
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ];
    let out = run(Observed::sse(source(&input), false, &Messages, s)).await;
    assert_eq!(out, input.concat());
    assert_eq!(*seen.lock().unwrap(), Some(105));

    let (s, seen) = sink();
    let done = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":321,\"output_tokens\":4}}}\n\n";
    run(Observed::sse(source(&[done]), false, &Responses, s)).await;
    assert_eq!(*seen.lock().unwrap(), Some(321));
}

/// Chunks follow the provider's writes and the network, not its events: an event that
/// reports usage is read wherever it is cut, and passes untouched.
#[tokio::test]
async fn usage_is_read_from_an_event_cut_across_chunks() {
    use crate::dialect::responses::Responses;
    let answer = "word ".repeat(4_000);
    let stream = format!(
        "event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}}\n\nevent: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"output_text\":\"{answer}\",\"usage\":{{\"input_tokens\":321,\"output_tokens\":4}}}}}}\n\n"
    );
    let stream: &'static str = Box::leak(stream.into_boxed_str());
    let completed_at = stream.find("event: response.completed").unwrap();
    for cut in [
        completed_at + 1,
        completed_at + 40,
        stream.len() / 2,
        stream.len() - 30,
        stream.len() - 1,
    ] {
        for strip in [false, true] {
            let (s, seen) = sink();
            let (a, b) = stream.split_at(cut);
            let out = run(Observed::sse(source(&[a, b]), strip, &Responses, s)).await;
            assert_eq!(out, stream, "cut at {cut}");
            assert_eq!(
                *seen.lock().unwrap(),
                Some(321),
                "cut at {cut}, strip {strip}"
            );
        }
    }
    // In 16 KiB chunks, as a long answer comes off the network.
    let chunks: Vec<&'static str> = stream
        .as_bytes()
        .chunks(1 << 14)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let (s, seen) = sink();
    let out = run(Observed::sse(source(&chunks), false, &Responses, s)).await;
    assert_eq!(out, stream);
    assert_eq!(*seen.lock().unwrap(), Some(321));
}

#[tokio::test]
async fn a_stream_reported_in_parts_is_merged() {
    use crate::dialect::anthropic::Messages;
    let (s, seen) = usage_sink();
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":90,\"cache_creation_input_tokens\":10,\"output_tokens\":1}}}\n\n";
    let delta = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":17}}\n\n";
    run(Observed::sse(source(&[start, delta]), false, &Messages, s)).await;
    let usage = seen.lock().unwrap().clone().expect("reported at the end");
    assert_eq!(
        usage,
        Usage {
            input_tokens: Some(105),
            output_tokens: Some(17),
            cache_read_tokens: Some(90),
            cache_creation_tokens: Some(10),
            model: Some("claude-x".into()),
        }
    );

    let (s, seen) = usage_sink();
    let body = "{\"model\":\"gpt-x-2026\",\"choices\":[],\"usage\":{\"prompt_tokens\":70,\"completion_tokens\":6,\"prompt_tokens_details\":{\"cached_tokens\":64}}}";
    run(Observed::json(source(&[body]), &Chat, s)).await;
    let usage = seen.lock().unwrap().clone().unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens
        ),
        (Some(70), Some(6), Some(64))
    );
    assert_eq!(usage.model.as_deref(), Some("gpt-x-2026"));

    let (s, seen) = usage_sink();
    let done = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-r\",\"usage\":{\"input_tokens\":321,\"input_tokens_details\":{\"cached_tokens\":300},\"output_tokens\":4}}}\n\n";
    run(Observed::sse(
        source(&[done]),
        false,
        &crate::dialect::responses::Responses,
        s,
    ))
    .await;
    let usage = seen.lock().unwrap().clone().unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens
        ),
        (Some(321), Some(4), Some(300))
    );
    assert_eq!(usage.model.as_deref(), Some("gpt-r"));
}

#[tokio::test]
async fn the_sink_hears_of_a_body_without_usage_and_of_one_dropped_early() {
    let (s, seen) = usage_sink();
    run(Observed::sse(
        source(&["data: {\"choices\":[{}]}\n\n", "data: [DONE]\n\n"]),
        false,
        &Chat,
        s,
    ))
    .await;
    assert_eq!(seen.lock().unwrap().clone(), Some(Usage::default()));

    let (s, seen) = usage_sink();
    let mut observed = Observed::sse(source(&["data: {}\n\n", USAGE]), false, &Chat, s);
    let first = observed.next().await;
    assert!(first.is_some());
    assert_eq!(*seen.lock().unwrap(), None, "not before the body ends");
    drop(observed);
    assert_eq!(seen.lock().unwrap().clone(), Some(Usage::default()));
}

/// A silence after a whole event and one cut inside an event: both end with one `error` event
/// in the dialect's shape, the stream's usage is reported, and the source is not polled again.
#[tokio::test]
async fn a_silence_ends_the_stream_with_an_error_event_in_the_clients_shape() {
    let usage_event =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1}}\n\n";
    for (before, strip, forwarded) in [
        (usage_event, false, usage_event),
        (
            "data: {\"choices\":[{\"delta\"",
            true,
            "data: {\"choices\":[{\"delta\"",
        ),
    ] {
        let silence = std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            Silent {
                limit: std::time::Duration::from_millis(250),
            },
        );
        let items = vec![Ok(Bytes::from_static(before.as_bytes())), Err(silence)];
        let source = futures::stream::iter(items).chain(futures::stream::once(async {
            panic!("polled after the end")
        }));
        let (s, reported) = sink();
        let out = run(Observed::sse(Box::pin(source), strip, &Chat, s)).await;
        let (sent, error_event) = out.split_once("\n\nevent: error\ndata: ").unwrap();
        assert_eq!(
            sent.trim_end_matches('\n'),
            forwarded.trim_end_matches('\n')
        );
        let error: serde_json::Value = serde_json::from_str(error_event.trim_end()).unwrap();
        assert_eq!(error["error"]["code"], "upstream_timeout");
        assert!(out.ends_with("\n\n"));
        let expected = (!strip).then_some(12);
        assert_eq!(*reported.lock().unwrap(), expected);
    }
}
