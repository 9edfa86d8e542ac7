//! The proxy binary and its signals at start-up: a SIGHUP (a reload asked right after start,
//! `systemctl reload`) that arrives before the reload watcher exists must not kill it and is
//! answered with a reload once the watcher runs; one after that is a reload too.
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

    /// Whether the process catches SIGHUP now (bit 0 of `SigCgt` in /proc/PID/status).
    fn catches_sighup(&self) -> bool {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap_or_default();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
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

/// The configuration is a symlink to a FIFO, so the proxy is held inside its first read until
/// the test writes it: the SIGHUP sent then lands before any handler of tokio's exists, during
/// the read, so the proxy must answer it with a reload once it runs. The symlink is pointed at
/// a regular file before the FIFO is written, so every later read reads that.
#[test]
fn a_sighup_during_start_up_is_a_reload_once_it_runs() {
    let dir = std::env::temp_dir().join(format!("pf-signals-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let (fifo, plain, config_path) = (dir.join("fifo"), dir.join("plain.yaml"), dir.join("config.yaml"));
    let path = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
    // SAFETY: creates a FIFO at a path we own; `path` is a valid C string.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
    std::os::unix::fs::symlink(&fifo, &config_path).expect("symlink");
    let config = "listeners: []\nroutes: []\nupstreams: []\nadmin: {address: \"127.0.0.1:0\"}\n";
    std::fs::write(&plain, config).expect("write the configuration");
    let log = dir.join("proxy.log");
    let logged = |what: &str| std::fs::read_to_string(&log).unwrap_or_default().contains(what);
    let mut proxy = Proxy(
        Command::new(env!("CARGO_BIN_EXE_proxyfleet-proxy"))
            .arg("--config")
            .arg(&config_path)
            .args(["--log-format", "text"])
            .stdout(std::fs::File::create(&log).expect("log file"))
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the proxy"),
    );
    // Its start-up code has run (SIGHUP caught); its open() of the FIFO blocks until a writer.
    assert!(
        until(Duration::from_secs(10), || proxy.catches_sighup()),
        "SIGHUP is not caught at start"
    );
    std::thread::sleep(Duration::from_millis(100));
    proxy.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(200));
    assert!(proxy.running(), "a SIGHUP during start-up killed the proxy");
    let swap = dir.join("swap");
    std::os::unix::fs::symlink(&plain, &swap).expect("symlink");
    std::fs::rename(&swap, &config_path).expect("point the configuration at a regular file");
    std::fs::write(&fifo, config).expect("write the configuration");
    assert!(
        until(Duration::from_secs(10), || logged("SIGHUP during start-up: reloading")
            && logged("reloaded")),
        "the SIGHUP during start-up was not answered"
    );
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
