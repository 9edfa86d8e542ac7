use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kube::api::{Api, ListParams};
use kube::Client;
use tokio::sync::watch;

use proxyfleet_operator::crd::ProxyDeployment;
use proxyfleet_operator::metrics::Metrics;
use proxyfleet_operator::policy::spec::ProxyFleetPolicy;
use proxyfleet_operator::resources::OperatorSettings;
use proxyfleet_operator::{admin, controller, leader};

/// proxyfleet-operator: reconciles ProxyDeployments into proxy fleets.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080", env = "PROXYFLEET_METRICS_ADDR")]
    metrics_addr: std::net::SocketAddr,
    /// Proxy image used when a ProxyDeployment names none.
    #[arg(long, env = "PROXYFLEET_DEFAULT_PROXY_IMAGE")]
    default_proxy_image: Option<String>,
    /// Run only while holding the leader lease (for more than one replica).
    #[arg(long, default_value_t = false, env = "PROXYFLEET_LEADER_ELECT")]
    leader_elect: bool,
    /// Namespace of the leader lease (defaults to the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "proxyfleet-system")]
    lease_namespace: String,
    /// This replica's identity in the lease (defaults to the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Lifetime of newly created managed CAs.
    #[arg(long, default_value = "8760h", env = "PROXYFLEET_CA_DURATION")]
    ca_duration: proxyfleet_config::HumanDuration,
    /// Namespace of member cluster Secrets (label proxyfleet.io/cluster); defaults to the lease namespace.
    #[arg(long, env = "PROXYFLEET_CLUSTERS_NAMESPACE")]
    clusters_namespace: Option<String>,
    /// Also read Argo CD cluster Secrets (argocd.argoproj.io/secret-type=cluster) from this
    /// namespace. Off unless given: Argo CD's credentials are not ours to lend.
    #[arg(long, env = "PROXYFLEET_ARGOCD_NAMESPACE")]
    argocd_namespace: Option<String>,
    /// How often member clusters are re-read for drift and status.
    #[arg(long, default_value = "15s", env = "PROXYFLEET_PROPAGATION_RESYNC")]
    propagation_resync: proxyfleet_config::HumanDuration,
    /// How long deleting a propagated fleet waits for unreachable members before letting go.
    #[arg(long, default_value = "5m", env = "PROXYFLEET_PROPAGATION_CLEANUP_TIMEOUT")]
    propagation_cleanup_timeout: proxyfleet_config::HumanDuration,
    /// Watch and write only these namespaces (comma-separated): a namespaced install, which
    /// needs Roles there instead of ClusterRoles. Empty: every namespace.
    #[arg(long, env = "PROXYFLEET_WATCH_NAMESPACES", value_delimiter = ',', default_value = "")]
    watch_namespaces: Vec<String>,
    /// Fleets reconciled at once (0: no limit). Every reconcile talks to the API server; a
    /// bound keeps a burst of new fleets from opening a connection each.
    #[arg(long, env = "PROXYFLEET_RECONCILE_CONCURRENCY", default_value_t = proxyfleet_operator::resources::DEFAULT_RECONCILE_CONCURRENCY)]
    reconcile_concurrency: u16,
    /// Log format: json or text.
    #[arg(long, default_value = "json", env = "PROXYFLEET_LOG_FORMAT")]
    log_format: String,
}

fn init_tracing(log_format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into());
    if log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_current_span(true)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
}

fn settings_of(args: &Args) -> OperatorSettings {
    let mut settings = OperatorSettings {
        ca_duration: args.ca_duration.get(),
        clusters_namespace: args
            .clusters_namespace
            .clone()
            .unwrap_or_else(|| args.lease_namespace.clone()),
        argocd_namespace: args.argocd_namespace.clone().filter(|n| !n.is_empty()),
        propagation_resync: args.propagation_resync.get(),
        propagation_cleanup_timeout: args.propagation_cleanup_timeout.get(),
        operator_namespace: args.lease_namespace.clone(),
        reconcile_concurrency: args.reconcile_concurrency,
        ..Default::default()
    };
    if let Some(img) = &args.default_proxy_image {
        settings.default_proxy_image = img.clone();
    }
    settings
}

/// One controller instance per watched namespace, or one for every namespace.
fn scopes_of(args: &Args) -> Vec<OperatorSettings> {
    let base = settings_of(args);
    let namespaces: Vec<&String> = args.watch_namespaces.iter().filter(|n| !n.trim().is_empty()).collect();
    if namespaces.is_empty() {
        return vec![base];
    }
    namespaces
        .into_iter()
        .map(|ns| OperatorSettings {
            watch_namespace: Some(ns.trim().to_string()),
            ..base.clone()
        })
        .collect()
}

/// The CRDs the caches need, listable: otherwise say which to install instead of waiting.
async fn crds_installed(client: &Client, scope: &OperatorSettings) -> Result<(), String> {
    let fleets: Api<ProxyDeployment> = scope.api(client);
    let hint = "Are the CRDs installed? kubectl apply -f crds/ (or helm install charts/proxyfleet)";
    fleets
        .list(&ListParams::default().limit(1))
        .await
        .map_err(|e| format!("cannot list ProxyDeployments ({e}).\n{hint}"))?;
    let policies: Api<ProxyFleetPolicy> = Api::all(client.clone());
    policies
        .list(&ListParams::default().limit(1))
        .await
        .map_err(|e| format!("cannot list ProxyFleetPolicies ({e}).\n{hint}"))?;
    Ok(())
}

/// Every controller instance, until `stop` turns true.
async fn run_controllers(
    client: Client,
    metrics: Arc<Metrics>,
    scopes: Vec<OperatorSettings>,
    identity: String,
    stop: watch::Receiver<bool>,
) {
    let runs = scopes.into_iter().map(|settings| {
        let mut stop = stop.clone();
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        controller::run(client.clone(), metrics.clone(), settings, identity.clone(), stopped)
    });
    futures::future::join_all(runs).await;
}

/// True while this replica leads (always, without leader election), and the election to end
/// on shutdown. Without an election the sender is returned and must be kept: a dropped sender
/// reads as leadership lost.
fn leadership(client: &Client, args: &Args, identity: &str) -> (Leadership, watch::Receiver<bool>) {
    let (leader_tx, leader_rx) = watch::channel(!args.leader_elect);
    if !args.leader_elect {
        return (Leadership::Always(leader_tx), leader_rx);
    }
    let election = leader::LeaderElection::new(client.clone(), &args.lease_namespace, "proxyfleet-operator", identity);
    (Leadership::Elected(election.spawn(leader_tx)), leader_rx)
}

enum Leadership {
    Always(#[allow(dead_code)] watch::Sender<bool>),
    Elected(leader::Resign),
}

impl Leadership {
    /// Gives the lease up, if there is one; only once this replica has stopped acting.
    async fn resign(self) {
        if let Leadership::Elected(election) = self {
            election.now().await;
        }
    }
}

/// Turns true on SIGTERM or Ctrl-C, and stays true: a signal that comes while nothing waits
/// (between two waits of the main loop) is still seen by the next wait.
fn on_sigterm() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        tracing::info!("shutting down");
        let _ = tx.send(true);
    });
    rx
}

/// Completes once SIGTERM has come (at once if it already has).
async fn terminated(shutdown: &watch::Receiver<bool>) {
    let mut shutdown = shutdown.clone();
    let _ = shutdown.wait_for(|term| *term).await;
}

/// Completes once this replica no longer leads (or the election has ended).
async fn leadership_lost(leader_rx: &mut watch::Receiver<bool>) {
    let _ = leader_rx.wait_for(|leading| !*leading).await;
}

/// How long stopping controllers may take before they are aborted: with the election's two
/// bounded calls (2 s each) it stays within the chart's 15 s grace period.
const STOP_WITHIN: Duration = Duration::from_secs(8);

/// Runs the controllers while this replica leads. Returns true on SIGTERM, once they have
/// stopped (aborted after [`STOP_WITHIN`], or at once if leadership is lost meanwhile); false
/// when they ended or leadership was lost (then aborted).
async fn lead(
    client: &Client,
    metrics: &Arc<Metrics>,
    scopes: &[OperatorSettings],
    identity: &str,
    leader_rx: &mut watch::Receiver<bool>,
    shutdown: &watch::Receiver<bool>,
) -> bool {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut controller = tokio::spawn(run_controllers(
        client.clone(),
        metrics.clone(),
        scopes.to_vec(),
        identity.to_string(),
        stop_rx,
    ));
    tokio::select! {
        _ = &mut controller => false,
        _ = leadership_lost(leader_rx) => {
            tracing::warn!("leadership lost: stopping the controller now");
            controller.abort();
            false
        }
        _ = terminated(shutdown) => {
            let _ = stop_tx.send(true);
            tokio::select! {
                _ = &mut controller => {}
                _ = leadership_lost(leader_rx) => {
                    tracing::warn!("leadership lost while stopping: aborting the controller now");
                    controller.abort();
                    let _ = controller.await;
                }
                _ = tokio::time::sleep(STOP_WITHIN) => {
                    controller.abort();
                    let _ = controller.await;
                }
            }
            true
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    proxyfleet_operator::crypto::install_provider();
    let args = Args::parse();
    init_tracing(&args.log_format);
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot reach the Kubernetes API: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // The CRD must be installed before anything else makes sense.
    let scopes = scopes_of(&args);
    if let Err(e) = crds_installed(&client, &scopes[0]).await {
        eprintln!("{e}");
        return std::process::ExitCode::FAILURE;
    }
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| std::env::var("HOSTNAME").unwrap_or_else(|_| "proxyfleet-operator".into()));
    let metrics = Arc::new(Metrics::new());
    tokio::spawn(proxyfleet_operator::heap_trim::run());
    let ready = Arc::new(AtomicBool::new(true));
    let (addr, m, r) = (args.metrics_addr, metrics.clone(), ready.clone());
    tokio::spawn(async move {
        if let Err(e) = admin::serve(addr, m, r).await {
            tracing::error!(error = %e, %addr, "metrics server failed");
        }
    });

    let (leadership, mut leader_rx) = leadership(&client, &args, &identity);
    let shutdown = on_sigterm();

    let watching: Vec<String> = scopes.iter().filter_map(|s| s.watch_namespace.clone()).collect();
    tracing::info!(%identity, leader_elect = args.leader_elect, ?watching, version = env!("CARGO_PKG_VERSION"), "proxyfleet-operator starting");
    loop {
        // Stand by until we lead.
        while !*leader_rx.borrow() {
            tokio::select! {
                r = leader_rx.changed() => if r.is_err() { return std::process::ExitCode::FAILURE },
                _ = terminated(&shutdown) => {
                    leadership.resign().await;
                    return std::process::ExitCode::SUCCESS;
                }
            }
        }
        metrics.leader.set(1);
        let terminating = lead(&client, &metrics, &scopes, &identity, &mut leader_rx, &shutdown).await;
        metrics.leader.set(0);
        ready.store(true, Ordering::Relaxed);
        if terminating {
            // Nothing acts any more: a successor may take over at once.
            leadership.resign().await;
            return std::process::ExitCode::SUCCESS;
        }
        // The election is gone (its sender dropped): never spin restarting the controller.
        if leader_rx.has_changed().is_err() {
            tracing::error!("leader election stopped; exiting");
            return std::process::ExitCode::FAILURE;
        }
    }
}
