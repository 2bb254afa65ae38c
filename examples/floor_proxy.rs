//! The floor under the proxy's own latency: a pass-through proxy with nothing in it but the
//! HTTP stack, built two ways, to measure what the layers cost before any of Compactor's work.
//!
//!   cargo run --release --example floor_proxy -- hyper LISTEN UPSTREAM
//!   cargo run --release --example floor_proxy -- axum-reqwest LISTEN UPSTREAM
//!
//! `hyper`: hyper's HTTP/1 server and hyper-util's pooled client, the request body read whole
//! and the answer streamed back. `axum-reqwest`: the same through axum's router and reqwest, the
//! stack Compactor is built on. LISTEN and UPSTREAM are `host:port`. Both run on a
//! single-threaded runtime when the process has one CPU, as Compactor does.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, mode, listen, upstream] = args.as_slice() else {
        eprintln!("usage: floor_proxy hyper|axum-reqwest LISTEN UPSTREAM");
        std::process::exit(2);
    };
    let listen: SocketAddr = listen.parse().expect("LISTEN is host:port");
    let one_cpu = std::thread::available_parallelism().is_ok_and(|n| n.get() == 1);
    let mut builder = if one_cpu {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = builder.enable_all().build().expect("runtime");
    let upstream = format!("http://{upstream}");
    match mode.as_str() {
        "hyper" => runtime.block_on(serve_hyper(listen, upstream)),
        "axum-reqwest" => runtime.block_on(serve_axum(listen, upstream)),
        "axum-hyper" => runtime.block_on(serve_axum_hyper(listen, upstream)),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
}

async fn serve_hyper(listen: SocketAddr, upstream: String) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (client, upstream) = (client.clone(), upstream.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (client, upstream) = (client.clone(), upstream.clone());
                async move {
                    let (parts, body) = request.into_parts();
                    let body = body
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let uri = format!("{upstream}{}", parts.uri.path());
                    let mut forward = Request::post(uri);
                    for name in ["content-type", "authorization"] {
                        if let Some(value) = parts.headers.get(name) {
                            forward = forward.header(name, value);
                        }
                    }
                    let forward = forward.body(Full::new(body)).expect("request");
                    let answer = match client.request(forward).await {
                        Ok(answer) => answer.map(|b| b.boxed()),
                        Err(_) => Response::builder()
                            .status(502)
                            .body(
                                Full::new(Bytes::from_static(b"upstream"))
                                    .map_err(|never| match never {})
                                    .boxed(),
                            )
                            .expect("response"),
                    };
                    Ok::<_, Infallible>(answer)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn serve_axum(listen: SocketAddr, upstream: String) {
    use axum::extract::State;
    use axum::http::HeaderMap;
    use axum::response::IntoResponse;

    let client = reqwest::Client::new();
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(
                |State((client, upstream)): State<(reqwest::Client, String)>,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    let mut forward = client
                        .post(format!("{upstream}/v1/chat/completions"))
                        .body(body);
                    for name in ["content-type", "authorization"] {
                        if let Some(value) = headers.get(name) {
                            forward = forward.header(name, value);
                        }
                    }
                    match forward.send().await {
                        Ok(answer) => {
                            let status = answer.status();
                            let content_type = answer.headers().get("content-type").cloned();
                            let mut response = axum::body::Body::from_stream(answer.bytes_stream())
                                .into_response();
                            *response.status_mut() = status;
                            if let Some(value) = content_type {
                                response.headers_mut().insert("content-type", value);
                            }
                            response
                        }
                        Err(_) => (axum::http::StatusCode::BAD_GATEWAY, "upstream").into_response(),
                    }
                },
            ),
        )
        .with_state((client, upstream));
    let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
    axum::serve(listener, app).await.expect("serve");
}

async fn serve_axum_hyper(listen: SocketAddr, upstream: String) {
    use axum::extract::State;
    use axum::http::HeaderMap;
    use axum::response::IntoResponse;

    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(
                |State((client, upstream)): State<(Client<HttpConnector, Full<Bytes>>, String)>,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    let mut forward = Request::post(format!("{upstream}/v1/chat/completions"));
                    for name in ["content-type", "authorization"] {
                        if let Some(value) = headers.get(name) {
                            forward = forward.header(name, value);
                        }
                    }
                    let forward = forward.body(Full::new(body)).expect("request");
                    match client.request(forward).await {
                        Ok(answer) => answer.map(axum::body::Body::new).into_response(),
                        Err(_) => (axum::http::StatusCode::BAD_GATEWAY, "upstream").into_response(),
                    }
                },
            ),
        )
        .with_state((client, upstream));
    let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
    axum::serve(listener, app).await.expect("serve");
}
