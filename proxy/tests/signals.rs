//! The proxy binary and its signals at start-up: a SIGHUP (a reload asked right after start,
//! `systemctl reload`) that arrives before the reload watcher exists must not kill it, and one
//! once it runs is a reload.
#![cfg(unix)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The proxy process, killed if the test ends early (a proxy stuck on the FIFO).
struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proxy {
    fn signal(&self, sig: libc::c_int) {
        // SAFETY: sends a signal to our own child, whose pid is live until we wait for it.
        let rc = unsafe { libc::kill(self.0.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill {sig}");
    }

    fn running(&mut self) -> bool {
        self.0.try_wait().expect("try_wait").is_none()
    }

    /// Whether the process ignores SIGHUP now (bit 0 of `SigIgn` in /proc/PID/status).
    fn ignores_sighup(&self) -> bool {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap_or_default();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0);
        mask & 1 == 1
    }
}

fn until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

/// The configuration is a FIFO, so the proxy is held inside its first read until the test
/// writes it: the SIGHUP sent then lands where no handler of ours is registered yet.
#[test]
fn a_sighup_before_the_configuration_is_read_does_not_kill_the_proxy() {
    let dir = std::env::temp_dir().join(format!("pf-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let fifo = dir.join("config.yaml");
    let _ = std::fs::remove_file(&fifo);
    let path = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
    // SAFETY: creates a FIFO at a path we own; `path` is a valid C string.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
    let config = "listeners: []\nroutes: []\nupstreams: []\nadmin: {address: \"127.0.0.1:0\"}\n";
    let log = dir.join("proxy.log");
    let logged = |what: &str| std::fs::read_to_string(&log).unwrap_or_default().contains(what);
    let mut proxy = Proxy(
        Command::new(env!("CARGO_BIN_EXE_proxyfleet-proxy"))
            .arg("--config")
            .arg(&fifo)
            .args(["--log-format", "text"])
            .stdout(std::fs::File::create(&log).expect("log file"))
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the proxy"),
    );
    // Its start-up code has run (SIGHUP ignored); its open() of the FIFO blocks until a writer.
    assert!(
        until(Duration::from_secs(10), || proxy.ignores_sighup()),
        "SIGHUP is not ignored at start"
    );
    proxy.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(200));
    assert!(proxy.running(), "a SIGHUP before start-up killed the proxy");
    std::fs::write(&fifo, config).expect("write the configuration");
    assert!(
        until(Duration::from_secs(10), || logged("admin listening")),
        "it never started"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(!logged("SIGHUP: reloading"), "the early SIGHUP, dropped, is no reload");
    // A reload reads the file again: a regular one from now on.
    let plain = dir.join("plain.yaml");
    std::fs::write(&plain, config).expect("write the configuration");
    std::fs::rename(&plain, &fifo).expect("replace the FIFO");
    proxy.signal(libc::SIGHUP);
    assert!(
        until(Duration::from_secs(10), || logged("SIGHUP: reloading")),
        "a SIGHUP once started is a reload"
    );
    proxy.signal(libc::SIGTERM);
    assert!(
        until(Duration::from_secs(30), || !proxy.running()),
        "it stops on SIGTERM"
    );
    let status = proxy.0.wait().expect("wait");
    assert!(status.success(), "drained and exited: {status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
