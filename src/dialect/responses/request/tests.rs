use super::*;
use crate::store::Checkpoint;

const BODY: &str = r#"{"model":"m","stream":true,"input":[
    {"type":"message","role":"developer","content":"be brief"},
    {"type":"message","role":"user","content":"one"},
    {"type":"function_call","call_id":"a","name":"read","arguments":"{}"},
    {"type":"function_call_output","call_id":"a","output":"A"},
    {"type":"message","role":"user","content":"two"}
],"tools":[{"type":"function","name":"read"}],"prompt_cache_key":"t1"}"#;

fn checkpoint(covered: usize) -> Checkpoint {
    Checkpoint {
        truncations: vec![],
        summary: "S".into(),
        ..crate::store::contract::sample("a", covered, 0)
    }
}

#[test]
fn renders_head_summary_and_kept_items_with_every_other_field_in_place() {
    let request = ResponsesRequest::parse(BODY.as_bytes()).unwrap();
    assert!(request.stream());
    let cp = checkpoint(4);
    let body = request.render(&Through {
        checkpoint: &cp,
        tokens: &[],
        merge_into_user: false,
        text: &format!("<summary>\n{}\n</summary>", cp.summary),
    });
    let text = String::from_utf8(body).unwrap();
    let at = |key: &str| text.find(&format!("\"{key}\":")).unwrap();
    let order = ["model", "stream", "input", "tools", "prompt_cache_key"].map(at);
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    let value: Value = serde_json::from_str(&text).unwrap();
    let input = value["input"].as_array().unwrap();
    assert_eq!(input.len(), 3);
    assert_eq!(input[0]["role"], "developer");
    assert_eq!(input[1]["role"], "user");
    assert!(input[1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("<summary>\nS\n"));
    assert_eq!(input[2]["content"], "two");
    assert_eq!(value["prompt_cache_key"], "t1");
}

#[test]
fn a_string_input_is_one_user_message_and_the_original_body_is_untouched() {
    let body = br#"{"model":"m","input":"hello","instructions":"be brief"}"#;
    let request = ResponsesRequest::parse(body).unwrap();
    assert_eq!(request.len(), 1);
    assert_eq!(request.role(0), Role::User);
    assert_eq!(request.original_body(), body.to_vec());
    assert!(request.head_tokens(Encoding::O200k) > TOKENS_FOR_TOOLS);
}

#[test]
fn bad_bodies_name_the_problem() {
    let cases: [(&str, &str); 6] = [
        ("[1]", "must be a JSON object"),
        (r#"{"input":[]}"#, "'model'"),
        (r#"{"model":"m"}"#, "'input'"),
        (r#"{"model":"m","input":7}"#, "'input'"),
        (r#"{"model":"m","input":[{"type":"message"}]}"#, "input[0]"),
        (
            r#"{"model":"m","input":[{"role":"user","content":"x"},4]}"#,
            "input[1]",
        ),
    ];
    for (body, expected) in cases {
        let error = ResponsesRequest::parse(body.as_bytes()).unwrap_err();
        assert!(error.to_string().contains(expected), "{body}: {error}");
    }
}

#[test]
fn ids_do_not_change_the_chain() {
    let a = ResponsesRequest::parse(
        br#"{"model":"m","input":[{"type":"message","id":"msg_1","role":"user","content":"x"}]}"#,
    )
    .unwrap();
    let b = ResponsesRequest::parse(
        br#"{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]}]}"#,
    )
    .unwrap();
    assert_eq!(a.canonical(0), b.canonical(0));
}
