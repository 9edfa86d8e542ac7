use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

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
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if args.log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_current_span(false)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let config = match proxyfleet_proxy::read_config(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let workers = config
        .worker_threads
        .map(usize::from)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
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
        tracing::info!(
            workers,
            version = env!("CARGO_PKG_VERSION"),
            "starting proxyfleet-proxy"
        );
        match proxyfleet_proxy::run(args.config, shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "proxy failed");
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
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
