//! The proxy binary and its signals at start-up: a SIGHUP (a reload asked right after start,
//! `systemctl reload`) that arrives before the reload watcher exists must not kill it.
#![cfg(unix)]

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const CONFIG: &str = "listeners: []\nroutes: []\nupstreams: []\nadmin: {address: \"127.0.0.1:0\"}\n";

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: sends a signal to our own child, whose pid is live until we wait for it.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill {sig}");
}

fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The configuration is a FIFO, so the proxy is held inside its first read, before any code of
/// its own has run past start-up, until the test writes it: the SIGHUP sent then lands in the
/// window where no handler is registered yet.
#[test]
fn a_sighup_before_the_configuration_is_read_does_not_kill_the_proxy() {
    let dir = std::env::temp_dir().join(format!("pf-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let fifo = dir.join("config.yaml");
    let _ = std::fs::remove_file(&fifo);
    let path = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
    // SAFETY: creates a FIFO at a path we own; `path` is a valid C string.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
    let mut child = Command::new(env!("CARGO_BIN_EXE_proxyfleet-proxy"))
        .arg("--config")
        .arg(&fifo)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the proxy");
    // Let it reach the read (its open() of the FIFO blocks until a writer comes).
    std::thread::sleep(Duration::from_millis(300));
    signal(&child, libc::SIGHUP);
    assert_eq!(
        exit_within(&mut child, Duration::from_millis(300)),
        None,
        "a SIGHUP before start-up killed the proxy"
    );
    std::fs::write(&fifo, CONFIG).expect("write the configuration");
    assert_eq!(
        exit_within(&mut child, Duration::from_secs(1)),
        None,
        "it starts and serves"
    );
    // A reload reads the file again: a regular one from now on.
    let plain = dir.join("plain.yaml");
    std::fs::write(&plain, CONFIG).expect("write the configuration");
    std::fs::rename(&plain, &fifo).expect("replace the FIFO");
    std::thread::sleep(Duration::from_millis(200));
    signal(&child, libc::SIGHUP);
    assert_eq!(
        exit_within(&mut child, Duration::from_millis(500)),
        None,
        "a SIGHUP once started is a reload"
    );
    signal(&child, libc::SIGTERM);
    let status = exit_within(&mut child, Duration::from_secs(30)).expect("it stops on SIGTERM");
    assert!(status.success(), "drained and exited: {status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
