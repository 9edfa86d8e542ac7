//! ACME HTTP-01 answers pushed through the admin listener: authenticated, answered before
//! routing (even on a listener that redirects to HTTPS), unknown tokens left to the routes,
//! cleared by an empty document, and shown by token in the admin report.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn challenges_are_answered_on_every_listener_before_routing() {
    init();
    let up = upstream("app", None, false).await;
    let dir = tempdir("acme-http01");
    let token = write(&dir, "token", "s3cret\n");
    let yaml = format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0", httpsRedirect: {{}}}}
  - {{name: plain, address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0", tokenFile: "{token}"}}
routes: [{{name: r, upstream: u}}]
upstreams: [{{name: u, endpoints: ["{}"]}}]
"#,
        up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let get = |listener: &'static str, path: &'static str| {
        let addr = proxy.addr(listener);
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            h1_get(tcp, "demo.example.com", path).await.unwrap()
        }
    };
    let path = "/.well-known/acme-challenge/tok_1";
    assert_eq!(
        get("http", path).await.0,
        308,
        "no challenge held: the redirect answers"
    );
    let doc = r#"{"tokens":{"tok_1":"tok_1.thumbprint"}}"#;
    assert_eq!(admin_put(&proxy, "/acme-challenges", "wrong", doc).await.0, 401);
    assert_eq!(
        admin_put(&proxy, "/acme-challenges", "s3cret", r#"{"tokens":{"../x":"../x.y"}}"#)
            .await
            .0,
        400
    );
    assert_eq!(admin_put(&proxy, "/acme-challenges", "s3cret", doc).await.0, 200);
    for listener in ["http", "plain"] {
        let (status, body) = get(listener, path).await;
        assert_eq!((status, body.as_str()), (200, "tok_1.thumbprint"), "on {listener}");
    }
    let (status, body) = get("plain", "/.well-known/acme-challenge/other").await;
    assert_eq!(status, 200, "an unknown token goes to the routes");
    assert!(body.starts_with("app "), "{body}");
    let tcp = tokio::net::TcpStream::connect(proxy.admin()).await.unwrap();
    let report = h1_get(tcp, "admin", proxyfleet_config::ADMIN_REPORT_PATH)
        .await
        .unwrap()
        .1;
    let report = proxyfleet_config::AdminReport::from_json(&report).unwrap();
    assert_eq!(report.acme_tokens, ["tok_1"]);
    assert_eq!(
        admin_put(&proxy, "/acme-challenges", "s3cret", r#"{"tokens":{}}"#)
            .await
            .0,
        200
    );
    assert_eq!(get("http", path).await.0, 308, "cleared");
    proxy.running.drain();
}
