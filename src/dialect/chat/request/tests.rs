use super::*;

#[test]
fn keeps_unknown_fields_and_bytes() {
    let body = br#"{"model":"gpt-4o","zeta":{"b":1,"a":[1.50,2]},"messages":[{"role":"user","content":"hi",  "x":1}],"stream":true}"#;
    let req = ChatRequest::parse(body).unwrap();
    assert!(req.settings.stream);
    assert_eq!(req.original_body(false), body.to_vec());
}

#[test]
fn forcing_usage_adds_or_merges_stream_options() {
    let req = ChatRequest::parse(br#"{"model":"m","messages":[],"stream":true}"#).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&req.original_body(true)).unwrap();
    assert_eq!(v["stream_options"]["include_usage"], true);
    let req = ChatRequest::parse(
        br#"{"model":"m","messages":[],"stream_options":{"x":1,"include_usage":false}}"#,
    )
    .unwrap();
    assert!(!req.client_wants_usage);
    let v: serde_json::Value = serde_json::from_slice(&req.original_body(true)).unwrap();
    assert_eq!(
        v["stream_options"],
        serde_json::json!({"x":1,"include_usage":true})
    );
}

#[test]
fn reports_position_of_syntax_errors() {
    let err = ChatRequest::parse(b"{\n  \"model\": \"x\",\n  oops\n}").unwrap_err();
    match err {
        RequestError::Json { line, column, .. } => assert_eq!((line, column), (3, 3)),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        ChatRequest::parse(b"[1]").unwrap_err(),
        RequestError::NotObject
    );
}

#[test]
fn validates_required_fields() {
    assert_eq!(
        ChatRequest::parse(br#"{"messages":[]}"#).unwrap_err(),
        RequestError::Missing("model")
    );
    assert_eq!(
        ChatRequest::parse(br#"{"model":"m"}"#).unwrap_err(),
        RequestError::Missing("messages")
    );
    assert!(matches!(
        ChatRequest::parse(br#"{"model":"m","messages":{}}"#).unwrap_err(),
        RequestError::Type {
            field: "messages",
            ..
        }
    ));
    assert!(matches!(
        ChatRequest::parse(br#"{"model":"m","messages":[3]}"#).unwrap_err(),
        RequestError::Message { index: 0, .. }
    ));
}

#[test]
fn reads_tool_calls_and_parts() {
    let req = ChatRequest::parse(
        br#"{"model":"m","max_tokens":50,"messages":[
          {"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x"}}]},
          {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"path\":\"a.rs\"}"}}]},
          {"role":"tool","tool_call_id":"c1","content":"fn main"}]}"#,
    )
    .unwrap();
    assert_eq!(req.settings.max_output_tokens, Some(50));
    assert_eq!(req.messages[0].view().media.len(), 1);
    assert_eq!(req.messages[0].view().text, "look");
    assert_eq!(req.messages[1].view().tool_calls[0].name, "read");
    assert_eq!(
        req.messages[1].view().tool_calls[0].arguments,
        r#"{"path":"a.rs"}"#
    );
    assert_eq!(req.messages[2].role, Role::Tool);
    assert_eq!(req.messages[2].view().tool_call_id.as_deref(), Some("c1"));
}
