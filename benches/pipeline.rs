//! CPU cost of the request path's stages, on the real sessions in ../shared/data/conversations
//! (absent: a generated conversation of similar shape). Each reports throughput in bytes.

use std::hint::black_box;
use std::path::Path;

use bytes::Bytes;
use compactor::compaction::plan::{plan, PlanInput};
use compactor::compaction::summary_text::summary_text;
use compactor::dialect::chat::request::ChatRequest;
use compactor::dialect::Role;
use compactor::dialect::{chat::Chat, Through, WireRequest};
use compactor::http::stream::Observed;
use compactor::identity;
use compactor::measure::Meter;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::StreamExt;
use serde_json::json;

fn conversations() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/conversations");
    let mut found: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().contains("_upto_"))
                })
                .filter_map(|p| {
                    Some((
                        p.file_stem()?.to_string_lossy().into_owned(),
                        std::fs::read(&p).ok()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|(_, b)| b.len());
    if found.is_empty() {
        found.push(("generated".into(), generated(800)));
    }
    found
}

/// A synthetic agent session of `turns` turns, for machines without the real ones.
fn generated(turns: usize) -> Vec<u8> {
    let mut messages = vec![json!({"role":"system","content":"You are a coding agent."})];
    for t in 0..turns {
        messages.push(json!({"role":"user","content": format!("step {t}: fix the parser edge case number {t}")}));
        messages.push(json!({"role":"assistant","content":null,"tool_calls":[{"id":format!("c{t}"),"type":"function","function":{"name":"read","arguments":format!("{{\"path\":\"src/m{t}.rs\"}}")}}]}));
        messages.push(json!({"role":"tool","tool_call_id":format!("c{t}"),"content":"fn parse(input: &str) -> Result<Ast, Error> { todo }\n".repeat(20)}));
    }
    serde_json::to_vec(&json!({"model":"gpt-4o","messages":messages})).unwrap()
}

fn tokenize(c: &mut Criterion) {
    let mut group = c.benchmark_group("tokenize");
    group.sample_size(10);
    for (name, body) in conversations() {
        let request = ChatRequest::parse(&body).unwrap();
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("cold", &name), &request, |b, r| {
            b.iter(|| Meter::new(100_000).measure(black_box(r)).total())
        });
        let warm = Meter::new(100_000);
        warm.measure(&request);
        group.bench_with_input(BenchmarkId::new("warm", &name), &request, |b, r| {
            b.iter(|| warm.measure(black_box(r)).total())
        });
    }
    // Text without word boundaries (one pre-tokenized piece for tiktoken alone): 300 KB of one
    // letter, and base64-like text.
    let base64: String = (0..300_000u32)
        .map(|i| b"AbCdEfGh0123+/xyz"[(i as usize * 7) % 17] as char)
        .collect();
    for (name, text) in [
        ("one_letter_300k", "a".repeat(300_000)),
        ("base64_300k", base64),
    ] {
        let body = serde_json::to_vec(
            &json!({"model":"gpt-4o","messages":[{"role":"user","content":text}]}),
        )
        .unwrap();
        let request = ChatRequest::parse(&body).unwrap();
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("cold", name), &request, |b, r| {
            b.iter(|| Meter::new(16).measure(black_box(r)).total())
        });
    }
    group.finish();
}

fn parse_and_hash(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse_and_hash");
    let (name, body) = conversations().pop().unwrap();
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function(BenchmarkId::new("parse", &name), |b| {
        b.iter(|| ChatRequest::parse(black_box(&body)).unwrap())
    });
    group.bench_function(BenchmarkId::new("blake3_raw", &name), |b| {
        b.iter(|| blake3::hash(black_box(&body)))
    });
    let request = ChatRequest::parse(&body).unwrap();
    group.bench_function(BenchmarkId::new("canonical_hashes", &name), |b| {
        b.iter(|| {
            request
                .messages
                .iter()
                .map(|m| identity::canonical_hash(&m.raw)[0] as usize)
                .sum::<usize>()
        })
    });
    group.finish();
}

/// Identify + plan + rewrite on the largest conversation, as the hot path does with a warm cache.
fn identify_plan_rewrite(c: &mut Criterion) {
    let mut group = c.benchmark_group("identify_plan_rewrite");
    let (name, body) = conversations().pop().unwrap();
    let request = ChatRequest::parse(&body).unwrap();
    let meter = Meter::new(100_000);
    meter.measure(&request);
    let tenant = identity::tenant("Bearer bench");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function(BenchmarkId::new("warm", &name), |b| {
        b.iter(|| {
            let measured = meter.measure(&request);
            let chain = identity::chain(&tenant, measured.elements.iter().map(|m| m.canonical));
            let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
            let tokens: Vec<u64> = measured.elements.iter().map(|m| m.tokens).collect();
            let chosen = plan(&PlanInput {
                roles: &roles,
                tokens: &tokens,
                start: 0,
                pinned: None,
                keep_budget: 20_000,
                step_budget: 0,
            })
            .unwrap();
            let checkpoint = compactor::store::Checkpoint {
                id: "bench".into(),
                tenant: identity::hex(&tenant),
                anchor: identity::hex(&chain[1]),
                covered: chosen.cut,
                prefix_hash: identity::hex(&chain[chosen.cut - 1]),
                pinned_user: chosen.pinned_user,
                truncations: chosen.truncations,
                summary: "## Goal\nbench".into(),
                files_read: vec![],
                files_modified: vec![],
                tokens_before: 0,
                tokens_after: 0,
                created_ms: 0,
                model: request.settings.model.clone(),
                ahead_of_time: false,
                cleared: None,
            };
            let text = summary_text(&checkpoint.summary, &[], &[]);
            let how = Through {
                checkpoint: &checkpoint,
                tokens: &tokens,
                merge_into_user: false,
                text: &text,
            };
            WireRequest::render(&request, &how).len()
        })
    });
    group.finish();
}

/// Forwarding an SSE stream through the usage observer, stripping the added usage event.
fn sse_forwarding(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse_forwarding");
    let event = |i: usize| {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"token{i} \"}}}}]}}\n\n")
    };
    let mut chunks: Vec<Bytes> = (0..1000).map(|i| Bytes::from(event(i))).collect();
    chunks.push(Bytes::from(
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12}}\n\n",
    ));
    chunks.push(Bytes::from("data: [DONE]\n\n"));
    let bytes: usize = chunks.iter().map(|c| c.len()).sum();
    group.throughput(Throughput::Bytes(bytes as u64));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    observe_both_ways(&mut group, &runtime, "observe", &chunks, &Chat);
    // One event longer than any TCP read (a Responses `response.completed` carrying a long
    // answer), arriving in 16 KiB chunks: held until its end, so each chunk must not rescan
    // what came before.
    let answer = "word ".repeat(180_000);
    let long = format!(
        "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"output_text\":\"{answer}\",\"usage\":{{\"input_tokens\":12}}}}}}\n\n"
    );
    let long_chunks: Vec<Bytes> = long
        .as_bytes()
        .chunks(16 * 1024)
        .map(Bytes::copy_from_slice)
        .collect();
    group.throughput(Throughput::Bytes(long.len() as u64));
    observe_both_ways(
        &mut group,
        &runtime,
        "one_long_event",
        &long_chunks,
        &compactor::dialect::responses::Responses,
    );
    group.finish();
}

/// `chunks` through the usage observer, passed and with the added usage event removed.
fn observe_both_ways(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    runtime: &tokio::runtime::Runtime,
    name: &str,
    chunks: &[Bytes],
    dialect: &'static dyn compactor::dialect::Dialect,
) {
    for strip in [false, true] {
        let way = if strip { "strip_usage" } else { "pass" };
        group.bench_function(BenchmarkId::new(name, way), |b| {
            b.to_async(runtime).iter(|| {
                // The observer owns its source, as it owns a provider's body.
                let owned = chunks.to_vec();
                let source = futures::stream::iter(owned.into_iter().map(Ok::<_, std::io::Error>));
                let observed = Observed::sse(Box::pin(source), strip, dialect, Box::new(|_| {}));
                async move {
                    observed
                        .map(|c| c.unwrap().len())
                        .fold(0, |a, n| async move { a + n })
                        .await
                }
            })
        });
    }
}

/// The served-request log line, through the text formatter and written directly (the same
/// text), into the batched log writer over a sink.
fn served_log_line(c: &mut Criterion) {
    use compactor::http::served_line::{self, ServedLine};
    use compactor::log_writer::{self, Batching};
    let (writer, _flush) = log_writer::start(std::io::sink(), Batching::default());
    served_line::write_plain_lines_to(writer.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(writer)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let line = ServedLine {
        dialect: "chat",
        path: "/v1/chat/completions",
        status: 200,
        model: "gpt-4o-mini",
        prompt_tokens: 1_234,
        tokens_sent: 1_234,
        compacted: false,
        conversation: "0123456789abcdef",
        checkpoint: "-",
        upstream_ms: 3,
        summary_ms: 0,
        overhead_us: 64,
    };
    let mut group = c.benchmark_group("served_log_line");
    // A request in a span (a named tenant's) takes the formatter.
    group.bench_function("formatter", |b| {
        let _in_span = tracing::info_span!("request").entered();
        b.iter(|| served_line::log(black_box(&line)))
    });
    group.bench_function("direct", |b| b.iter(|| served_line::log(black_box(&line))));
    group.finish();
}

criterion_group!(
    benches,
    tokenize,
    parse_and_hash,
    identify_plan_rewrite,
    sse_forwarding,
    served_log_line
);
criterion_main!(benches);
