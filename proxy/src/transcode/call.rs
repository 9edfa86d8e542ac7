//! One transcoded call on the wire: the HTTP/JSON request read and turned into a gRPC request
//! for the upstream, and the upstream's gRPC answer turned into JSON.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::message::{self, JsonOptions};
use super::{status, Binding, Transcoder};
use crate::body::{BodyRules, BodyTimedOut, BodyTooLarge, ClientBody, RequestBody, UpstreamBody};
use crate::metrics::TranscodeLabels;

const TOO_LARGE: &str = "the upstream's message is larger than 4 MiB, the most the proxy turns into JSON";

/// A call under way: what the response needs to become JSON.
pub struct Call {
    binding: Arc<Binding>,
    options: JsonOptions,
    route: Arc<str>,
    metrics: crate::metrics::TranscodeFamily,
}

fn json_response(status: StatusCode, json: &serde_json::Value) -> Response<ClientBody> {
    let mut r = Response::new(crate::body::full_owned(format!("{json}\n")));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A JSON error the client caused, as a gRPC status would say it.
fn refused(code: u32, message: &str) -> Response<ClientBody> {
    json_response(status::describe(code).1, &status::error_json(code, message))
}

impl Transcoder {
    /// The gRPC request for an HTTP/JSON request, or the answer when there is none to make:
    /// no binding for the path (404), a body too large (413) or not fitting the method's
    /// input (400).
    pub async fn prepare(
        &self,
        req: Request<RequestBody>,
        body_rules: BodyRules,
    ) -> Result<(Request<RequestBody>, Call), Response<ClientBody>> {
        let Some((binding, vars)) = self.find(req.method(), req.uri().path()) else {
            return Err(refused(
                5,
                "no HTTP binding of this route's gRPC methods matches the method and path",
            ));
        };
        let binding = binding.clone();
        let (mut parts, body) = req.into_parts();
        // Read as any streamed body is: within the size limit, and cut off when the client
        // sends nothing for `clientBodyTimeout`.
        let body_rules = BodyRules {
            max_bytes: body_rules.max_bytes.min(self.max_body),
            ..body_rules
        };
        let body = match UpstreamBody::streaming(body, body_rules).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<BodyTooLarge>() => {
                return Err(json_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &status::error_json(8, "request body too large"),
                ))
            }
            Err(e) if e.is::<BodyTimedOut>() => {
                return Err(json_response(
                    StatusCode::REQUEST_TIMEOUT,
                    &status::error_json(4, &e.to_string()),
                ))
            }
            Err(_) => return Err(refused(3, "the request body could not be read")),
        };
        let msg = message::request_message(&binding, &body, &vars, parts.uri.query())
            .map_err(|e| refused(3, &e.to_string()))?;
        let mut uri = parts.uri.into_parts();
        uri.path_and_query = Some(binding.grpc_path.clone());
        parts.uri = http::Uri::from_parts(uri).map_err(|_| refused(3, "bad request target"))?;
        parts.method = http::Method::POST;
        grpc_headers(&mut parts.headers);
        let data = Some(message::frame(&msg));
        let call = Call {
            binding,
            options: self.options,
            route: self.route.clone(),
            metrics: self.metrics.clone(),
        };
        Ok((Request::from_parts(parts, RequestBody::Full { data }), call))
    }
}

/// The client's headers as a gRPC request carries them: its own, minus the body's.
fn grpc_headers(headers: &mut HeaderMap) {
    for h in [
        header::CONTENT_LENGTH,
        header::CONTENT_TYPE,
        header::ACCEPT_ENCODING,
        header::ACCEPT,
    ] {
        headers.remove(h);
    }
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
}

/// `grpc-status` and `grpc-message`, from trailers or (a trailers-only answer) the head.
fn grpc_status(map: &HeaderMap) -> Option<(u32, String)> {
    let code = map.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = map
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .and_then(super::template::percent_decode)
        .unwrap_or_default();
    Some((code, message))
}

impl Call {
    fn count(&self, code: u32) {
        self.metrics
            .get_or_create(&TranscodeLabels {
                route: self.route.to_string(),
                method: self.binding.method.full_name().to_string(),
                code: status::describe(code).0,
            })
            .inc();
    }

    /// The upstream's answer as JSON. An answer that is not gRPC (the proxy's own 502 or 504,
    /// say) passes as it is. With `read_ahead` (an HTTP/2 client's `limits.sendTimeout`), a
    /// server stream is read ahead of the client (`crate::upstream::read_ahead`).
    pub async fn respond(self, resp: Response<ClientBody>, read_ahead: Option<Duration>) -> Response<ClientBody> {
        let is_grpc = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        if !is_grpc {
            return resp;
        }
        if let Some((code, message)) = grpc_status(resp.headers()) {
            self.count(code);
            if code != 0 {
                return refused(code, &message);
            }
        }
        if self.binding.method.is_server_streaming() {
            return self.stream(crate::body::ahead_of_client(resp, read_ahead, None));
        }
        self.unary(resp).await
    }

    async fn unary(self, resp: Response<ClientBody>) -> Response<ClientBody> {
        let limited = http_body_util::Limited::new(resp.into_body(), message::MAX_MESSAGE + 5);
        let collected = match limited.collect().await {
            Ok(collected) => collected,
            Err(e) if e.is::<http_body_util::LengthLimitError>() => return self.too_large(),
            Err(_) => {
                self.count(14);
                return refused(14, "the upstream's answer was cut short");
            }
        };
        let (code, message) = collected
            .trailers()
            .and_then(grpc_status)
            .unwrap_or((2, "no grpc-status".into()));
        self.count(code);
        if code != 0 {
            return refused(code, &message);
        }
        let mut buf = BytesMut::from(collected.to_bytes());
        match message::unframe(&mut buf) {
            Some(Ok(msg)) => match message::response_json(&self.binding, msg, self.options) {
                Ok(json) => json_response(StatusCode::OK, &json),
                Err(e) => refused(13, &format!("the upstream's answer does not decode: {e}")),
            },
            Some(Err(e)) => refused(13, e),
            None => refused(13, "the upstream answered OK without a message"),
        }
    }

    /// An upstream message larger than the proxy decodes: the upstream's fault, said as gRPC's
    /// RESOURCE_EXHAUSTED would be.
    fn too_large(&self) -> Response<ClientBody> {
        self.count(8);
        json_response(StatusCode::BAD_GATEWAY, &status::error_json(8, TOO_LARGE))
    }

    /// A server stream: each message as `{"result": …}` on its own line as it arrives, and a
    /// failure after the first message as `{"error": …}` (the status is already 200).
    fn stream(self, resp: Response<ClientBody>) -> Response<ClientBody> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut body = resp.into_body();
        tokio::spawn(async move {
            // A slot kept for the end, so that it is said even to a client that fell behind.
            let Ok(last) = tx.clone().reserve_owned().await else {
                return;
            };
            let mut buf = BytesMut::new();
            let mut end = (2, "the stream ended without a status".to_string());
            loop {
                // A client gone ends the call at once, not at the upstream's next message
                // (a quiet watch stream would hold its upstream stream for ever).
                let frame = tokio::select! {
                    frame = body.frame() => frame,
                    _ = tx.closed() => {
                        self.count(1);
                        return;
                    }
                };
                let Some(frame) = frame else { break };
                let frame = match frame {
                    Ok(frame) => frame,
                    // The client fell behind and stayed too slow: its stream fails, as a
                    // cancelled call (1), with no last line it could not take.
                    Err(e) if e.is::<crate::upstream::ClientStalled>() => {
                        self.count(1);
                        last.send(Err(e));
                        return;
                    }
                    Err(_) => {
                        end = (14, "the upstream's stream was cut short".into());
                        break;
                    }
                };
                let frame = match frame.into_data() {
                    Ok(data) => data,
                    Err(f) => {
                        end = f.trailers_ref().and_then(grpc_status).unwrap_or(end);
                        continue;
                    }
                };
                buf.extend_from_slice(&frame);
                while let Some(msg) = message::unframe(&mut buf) {
                    let line = match msg
                        .map_err(str::to_string)
                        .and_then(|m| message::response_json(&self.binding, m, self.options))
                    {
                        Ok(json) => serde_json::json!({ "result": json }),
                        Err(e) => serde_json::json!({ "error": status::error_json(13, &e) }),
                    };
                    if tx.send(Ok(Bytes::from(format!("{line}\n")))).await.is_err() {
                        self.count(1); // the client went away: cancelled
                        return;
                    }
                }
                if message::declared_too_large(&buf) {
                    end = (8, TOO_LARGE.into());
                    break;
                }
            }
            self.count(end.0);
            if end.0 != 0 {
                let line = serde_json::json!({ "error": status::error_json(end.0, &end.1) });
                last.send(Ok(Bytes::from(format!("{line}\n"))));
            }
        });
        let mut r = Response::new(ClientBody::Channel { rx });
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
        r
    }
}
