use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use proxyfleet_proxy::workers::Workers;

/// mimalloc instead of glibc's malloc: the request path allocates and frees small buffers
/// (headers, TLS records, futures) at a high rate; see docs/decisions.md for the measurement.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// proxyfleet-proxy: TLS-terminating reverse proxy with pooled, resumed upstream TLS.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Path of the YAML configuration.
    #[arg(long, env = "PROXYFLEET_CONFIG")]
    config: PathBuf,
    /// Validate the configuration (including certificate files) and exit.
    #[arg(long)]
    check: bool,
    /// Log format: json or text.
    #[arg(long, default_value = "json", env = "PROXYFLEET_LOG_FORMAT")]
    log_format: String,
    /// Where a fatal error is also written (Kubernetes' terminationMessagePath), so the
    /// operator can quote why a pod does not start.
    #[arg(long, env = "PROXYFLEET_TERMINATION_LOG")]
    termination_log: Option<PathBuf>,
}

/// Reports a fatal error on stderr and, when asked, in the termination message file.
fn fatal(termination_log: Option<&std::path::Path>, message: &str, code: ExitCode) -> ExitCode {
    eprintln!("{message}");
    if let Some(path) = termination_log {
        // Best effort: the kubelet falls back to the log tail when this is empty.
        let _ = std::fs::write(path, message.as_bytes());
    }
    code
}

/// mimalloc's `arena_eager_commit` (mimalloc.h, v2 option 4; libmimalloc-sys exports no name
/// for it). Off, arenas commit memory as it is used: idle RSS 19.7 → 8 MiB, throughput unchanged.
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

extern "C" fn at_start() {
    // SAFETY: sets a plain integer option in mimalloc's static table; runs single-threaded.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
    // A SIGHUP (a reload asked right after start) is only noted until the reload watcher
    // listens: by default it would kill the process. One noted after the configuration was read
    // is answered by the watcher when it starts (`reload::note_hangup`).
    #[cfg(unix)]
    {
        let handler: extern "C" fn(libc::c_int) = proxyfleet_proxy::reload::note_hangup;
        // SAFETY: installs a handler that only stores to an atomic (async-signal-safe), with
        // SA_RESTART so no system call of start-up fails with EINTR; runs single-threaded.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGHUP, &action, std::ptr::null_mut());
        }
    }
}

/// Runs before the Rust runtime's first allocation (which reserves mimalloc's first arena), so
/// the option applies to it; setting it in `main` is too late. The SIGHUP handler is set here
/// too, before any code of ours runs.
#[used]
#[link_section = ".init_array.00099"]
static AT_START: extern "C" fn() = at_start;

fn main() -> ExitCode {
    let args = Args::parse();
    // rustls warns for every client that sends an IP address as SNI (curl and wrk to an IP do):
    // per-connection noise, not news. RUST_LOG overrides.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,rustls::msgs::handshake=error".into());
    if args.log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_current_span(false)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    // Our own TLS configs name their provider; this default is for any library that asks for
    // the process-wide one (rustls cannot pick one when ring is linked beside aws-lc-rs).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let term_log = args.termination_log.clone();
    proxyfleet_proxy::reload::forget_hangups();
    let config = match proxyfleet_proxy::read_config(&args.config) {
        Ok(c) => c,
        Err(e) => return fatal(term_log.as_deref(), &e.to_string(), ExitCode::from(2)),
    };
    let (runtime, extra, workers, spin) = match runtimes(&config, args.check) {
        Ok(r) => r,
        Err(e) => return fatal(term_log.as_deref(), &e, ExitCode::FAILURE),
    };
    runtime.block_on(async move {
        if args.check {
            let metrics = proxyfleet_proxy::metrics::Metrics::new();
            return match proxyfleet_proxy::state::ProxyState::build(config, None, &metrics, &Default::default()) {
                Ok(_) => {
                    println!("configuration OK");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(2)
                }
            };
        }
        // Registered before anything slow (the state, TLS files, DNS): until then a SIGTERM
        // would skip the drain. (A SIGHUP is noted from process start: `at_start`.)
        let shutdown = shutdown_signal();
        tracing::info!(
            workers,
            idle_spin_us = spin.as_micros() as u64,
            version = env!("CARGO_PKG_VERSION"),
            "starting proxyfleet-proxy"
        );
        match proxyfleet_proxy::run(config, args.config, extra, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "proxy failed");
                fatal(term_log.as_deref(), &e.to_string(), ExitCode::FAILURE)
            }
        }
    })
}

/// This thread's runtime (worker 0), the other workers (none for `--check`), how many in all, and
/// the idle spin each gets. Every worker is a thread with its own current-thread runtime
/// (`proxyfleet_proxy::workers`).
fn runtimes(
    config: &proxyfleet_config::ProxyConfig,
    check: bool,
) -> Result<(tokio::runtime::Runtime, Workers, usize, std::time::Duration), String> {
    let workers = config
        .worker_threads
        .map(usize::from)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let spin = proxyfleet_proxy::idle_spin::spin_for(config.idle_spin_micros, || {
        proxyfleet_proxy::cpu_quota::under_cpu_quota()
    });
    let mut builder = tokio::runtime::Builder::new_current_thread();
    proxyfleet_proxy::idle_spin::install(&mut builder, spin);
    let runtime = builder
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    let extra = match check {
        true => Workers::none(),
        false => Workers::start(workers, spin).map_err(|e| e.to_string())?,
    };
    Ok((runtime, extra, workers, spin))
}

/// Resolves on SIGTERM or SIGINT; the SIGTERM handler is in place once this returns (before
/// the future is first polled).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        #[cfg(unix)]
        {
            let Ok(mut term) = term else {
                let _ = tokio::signal::ctrl_c().await;
                return;
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
