use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn documented_file_states_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/compactor.toml");
    let from_file = Config::load(Some(&path), vec![], &CliOverrides::default()).unwrap();
    assert_eq!(from_file, Config::default());
}

#[test]
fn unknown_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[compaction]\nkeep_recnt_tokens = 5\n").unwrap();
    let err = Config::load(Some(&path), vec![], &CliOverrides::default()).unwrap_err();
    assert!(err.to_string().contains("keep_recnt_tokens"), "{err}");
}

#[test]
fn env_overrides_file_and_cli_overrides_env() {
    let cfg = Config::load(
        None,
        env(&[
            ("COMPACTOR_UPSTREAM", "http://env.example/v1"),
            ("COMPACTOR_COMPACTION__KEEP_RECENT_TOKENS", "1234"),
            ("COMPACTOR_ADMIN_TOKEN", "42"),
            ("COMPACTOR_CACHE", "/tmp/ignored"),
            ("COMPACTOR_LISTEN", "127.0.0.1:1"),
        ]),
        &CliOverrides {
            listen: Some("127.0.0.1:9".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(cfg.upstream, "http://env.example/v1");
    assert_eq!(cfg.compaction.keep_recent_tokens, 1234);
    assert_eq!(cfg.admin_token, "42");
    assert_eq!(cfg.listen, "127.0.0.1:9");
}

#[test]
fn invalid_values_are_rejected_with_the_key() {
    let err = Config::load(
        None,
        env(&[("COMPACTOR_UPSTREAM", "not a url")]),
        &CliOverrides::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("upstream"), "{err}");
    let err = Config::load(
        None,
        env(&[("COMPACTOR_COMPACTION__KEEP_RECENT_TOKENS", "lots")]),
        &CliOverrides::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("invalid"), "{err}");
}

#[test]
fn redaction_hides_secrets() {
    let cfg = Config {
        admin_token: "s3cret".into(),
        store: "redis://user:pw@redis:6379/".into(),
        ..Config::default()
    };
    let shown = cfg.redacted_toml();
    assert!(
        !shown.contains("s3cret") && !shown.contains("pw@"),
        "{shown}"
    );
    assert!(shown.contains("@redis:6379"));
}

#[test]
fn an_open_relay_is_warned_about_unless_on_loopback() {
    let relay = Config {
        listen: "0.0.0.0:8787".into(),
        upstream_key_env: "TEAM_KEY".into(),
        ..Config::default()
    };
    let warning = relay.open_relay_warning().unwrap();
    assert!(warning.contains("OPEN RELAY") && warning.contains("TEAM_KEY"));
    let loopback = Config {
        listen: "127.0.0.1:8787".into(),
        ..relay.clone()
    };
    assert_eq!(loopback.open_relay_warning(), None);
    let keyed = Config {
        gateway_keys_file: "keys".into(),
        ..relay.clone()
    };
    assert_eq!(keyed.open_relay_warning(), None);
    let no_key = Config {
        upstream_key_env: String::new(),
        ..relay
    };
    assert_eq!(no_key.open_relay_warning(), None);
}

#[test]
fn url_credentials_are_redacted_everywhere() {
    let cfg = Config {
        upstream: "http://user:pw1@h/v1?api-key=k2&api-version=2024-10-21".into(),
        summarizer: SummarizerConfig {
            upstream: "https://h2/v1?key=k3".into(),
            ..SummarizerConfig::default()
        },
        store: "rediss://:pw4@redis:6380/0".into(),
        anthropic_upstream: "https://bob:pw5@a.example/v1?token=k6".into(),
        telemetry: TelemetryConfig {
            otlp_endpoint: "https://carol:pw7@otel.example:4318?api-key=k8".into(),
            ..TelemetryConfig::default()
        },
        ..Config::default()
    };
    let shown = cfg.redacted_toml();
    for secret in [
        "pw1", "k2", "k3", "pw4", "//user", "pw5", "k6", "bob", "carol", "pw7", "k8",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    let table: toml::Table = toml::from_str(&shown).unwrap();
    assert_eq!(
        table["upstream"].as_str(),
        Some("http://redacted@h/v1?api-key=redacted&api-version=2024-10-21")
    );
    assert_eq!(
        table["anthropic_upstream"].as_str(),
        Some("https://redacted@a.example/v1?token=redacted")
    );
    assert_eq!(redact_url("compactor.sqlite3"), "compactor.sqlite3");
    assert_eq!(redact_url("memory"), "memory");
    assert_eq!(redact_url("http://h/v1"), "http://h/v1");
    assert_eq!(redact_url("http://h:10"), "http://h:10");
}

#[test]
fn responses_compaction_is_emulated_unless_the_upstream_is_openai() {
    let with = |upstream: &str, mode: &str| {
        let env = env(&[
            ("COMPACTOR_UPSTREAM", upstream),
            ("COMPACTOR_RESPONSES__SERVER_COMPACTION", mode),
        ]);
        Config::load(None, env, &CliOverrides::default())
            .unwrap()
            .emulates_responses_compaction()
    };
    assert!(!with("https://api.openai.com/v1", "auto"));
    assert!(with("http://127.0.0.1:8080/v1", "auto"));
    assert!(with("https://api.openai.com/v1", "emulate"));
    assert!(!with("http://127.0.0.1:8080/v1", "passthrough"));
    let refused = Config::load(
        None,
        env(&[("COMPACTOR_RESPONSES__SERVER_COMPACTION", "sometimes")]),
        &CliOverrides::default(),
    );
    assert!(refused.is_err());
}

#[test]
fn telemetry_is_off_by_default_and_its_endpoint_is_checked() {
    let off = Config::load(None, vec![], &CliOverrides::default()).unwrap();
    assert_eq!(off.telemetry.otlp_endpoint, "");
    assert_eq!(off.telemetry.service_name, "compactor");
    let on = Config::load(
        None,
        env(&[(
            "COMPACTOR_TELEMETRY__OTLP_ENDPOINT",
            "http://127.0.0.1:4318",
        )]),
        &CliOverrides::default(),
    )
    .unwrap();
    assert_eq!(on.telemetry.otlp_endpoint, "http://127.0.0.1:4318");
    let shown: toml::Table = toml::from_str(&on.redacted_toml()).unwrap();
    assert_eq!(
        shown["telemetry"]["otlp_endpoint"].as_str(),
        Some("http://127.0.0.1:4318")
    );
    let err = Config::load(
        None,
        env(&[("COMPACTOR_TELEMETRY__OTLP_ENDPOINT", "collector:4318")]),
        &CliOverrides::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("telemetry.otlp_endpoint"), "{err}");
}

#[test]
fn a_named_but_missing_sealing_secret_is_refused() {
    for (key, var) in [
        ("COMPACTOR_RESPONSES__COMPACTION_SECRET_ENV", "SEAL_NOW"),
        (
            "COMPACTOR_RESPONSES__COMPACTION_SECRET_PREVIOUS_ENV",
            "SEAL_BEFORE",
        ),
    ] {
        for set in [None, Some("")] {
            let mut pairs = vec![(key, var)];
            pairs.extend(set.map(|value| (var, value)));
            let err = Config::load(None, env(&pairs), &CliOverrides::default()).unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains(var) && message.contains("unset or empty"),
                "{message}"
            );
        }
        let loaded = Config::load(
            None,
            env(&[(key, var), (var, "a long random secret")]),
            &CliOverrides::default(),
        );
        assert!(loaded.is_ok(), "{loaded:?}");
    }
}

#[test]
fn context_management_is_emulated_unless_the_upstream_is_anthropic() {
    let with = |upstream: &str, mode: &str| {
        let env = env(&[
            ("COMPACTOR_ANTHROPIC_UPSTREAM", upstream),
            ("COMPACTOR_MESSAGES__CONTEXT_MANAGEMENT", mode),
        ]);
        Config::load(None, env, &CliOverrides::default())
            .unwrap()
            .emulates_context_management()
    };
    assert!(!with("https://api.anthropic.com", "auto"));
    assert!(with("http://127.0.0.1:8080", "auto"));
    assert!(with("https://api.anthropic.com", "emulate"));
    assert!(!with("http://127.0.0.1:8080", "passthrough"));
    assert!(!Config::default().emulates_context_management());
}
