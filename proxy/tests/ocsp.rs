//! OCSP stapling with real peers: responses made by `openssl ocsp` (a CA, its index and a
//! signed response), checked by `openssl s_client -status` against the proxy. A good response
//! is stapled; after the file is replaced by a response saying "revoked", the reload serves no
//! staple and counts why.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::*;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a leaf for ocsp.example.com, and an OCSP response for the leaf with `status` (V or R).
fn make_pki(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=ocsp-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=ocsp.example.com",
            "-keyout",
            "tls.key",
            "-out",
            "tls.csr",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:ocsp.example.com\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "tls.crt",
        ],
    );
    openssl(
        dir,
        &[
            "ocsp",
            "-issuer",
            "ca.crt",
            "-cert",
            "tls.crt",
            "-no_nonce",
            "-reqout",
            "req.der",
        ],
    );
}

fn respond(dir: &Path, status: char, out: &str) {
    let serial = Command::new("openssl")
        .args(["x509", "-in", "tls.crt", "-noout", "-serial"])
        .current_dir(dir)
        .output()
        .unwrap();
    let serial = String::from_utf8_lossy(&serial.stdout)
        .trim()
        .trim_start_matches("serial=")
        .to_string();
    let revoked = if status == 'R' { "240101000000Z" } else { "" };
    std::fs::write(
        dir.join("index.txt"),
        format!("{status}\t351231000000Z\t{revoked}\t{serial}\tunknown\t/CN=ocsp.example.com\n"),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "ocsp",
            "-index",
            "index.txt",
            "-rsigner",
            "ca.crt",
            "-rkey",
            "ca.key",
            "-CA",
            "ca.crt",
            "-ndays",
            "1",
            "-reqin",
            "req.der",
            "-respout",
            out,
        ],
    );
}

/// What `openssl s_client -status` says about the stapled response.
fn s_client_status(addr: std::net::SocketAddr) -> String {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-servername",
            "ocsp.example.com",
            "-status",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_response_is_stapled_and_a_revoked_one_is_not() {
    init();
    let dir = tempdir("ocsp");
    make_pki(&dir);
    respond(&dir, 'V', "tls.ocsp");
    let up = upstream("app", None, false).await;
    let yaml = format!(
        r#"
listeners:
  - name: web
    address: "127.0.0.1:0"
    tls: {{certificates: [{{certFile: "{d}/tls.crt", keyFile: "{d}/tls.key", ocspFile: "{d}/tls.ocsp"}}]}}
routes: [{{name: r, upstream: app}}]
upstreams: [{{name: app, endpoints: ["{up}"]}}]
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 100ms, deadline: 2s}}
"#,
        d = dir.display(),
        up = up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let addr = proxy.addr("web");
    let out = tokio::task::spawn_blocking(move || s_client_status(addr))
        .await
        .unwrap();
    assert!(out.contains("OCSP Response Status: successful"), "{out}");
    assert!(out.contains("Cert Status: good"), "{out}");

    // The responder now says revoked: the new file is read on reload and not stapled.
    respond(&dir, 'R', "revoked.ocsp");
    std::fs::rename(dir.join("revoked.ocsp"), dir.join("tls.ocsp")).unwrap();
    let mut unstapled = String::new();
    for _ in 0..100 {
        unstapled = tokio::task::spawn_blocking(move || s_client_status(addr))
            .await
            .unwrap();
        if unstapled.contains("OCSP response: no response sent") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(unstapled.contains("OCSP response: no response sent"), "{unstapled}");
    let m = metrics(&proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_ocsp_staples_total", &["result=\"stapled\""]),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "proxyfleet_ocsp_staples_total", &["result=\"not_good\""]),
        1.0,
        "{m}"
    );
}
