//! kubectl-proxyfleet: watch and steer ProxyDeployment rollouts.
//!
//!   kubectl proxyfleet get pxd NAME [-n NS] [--watch]
//!   kubectl proxyfleet promote NAME [--full] | abort NAME | retry NAME | pause NAME | resume NAME
//!   kubectl proxyfleet history NAME | undo NAME [--to-revision N]
//!   kubectl proxyfleet status NAME [--timeout 600]   (exit 0 healthy, 1 degraded/aborted, 2 timeout)
//!   App gray releases: NAME = approllout/NAME (or apr/NAME) for get, promote, abort, retry,
//!   pause, resume and status; `get apr NAME` too.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::Client;

use proxyfleet_operator::canary::rollout::COMMAND_ANNOTATION;
use proxyfleet_operator::command_annotation::send_patch;
use proxyfleet_operator::crd::ProxyDeployment;
use proxyfleet_operator::history::{template_of, undo_patch, undo_target, Kept};
use proxyfleet_operator::labels;
use proxyfleet_operator::propagation::waves_shell::WAVE_COMMAND;

#[derive(Parser)]
#[command(name = "kubectl-proxyfleet", version, about = "Watch and steer proxyfleet rollouts")]
struct Cli {
    /// Namespace (default: the kubeconfig's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    /// The kubeconfig context to use (default: its current one).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show a ProxyDeployment as a tree: steps, weights, analysis, pods.
    Get {
        /// Always `pxd` (kept for kubectl-like syntax).
        kind: String,
        name: String,
        #[arg(short, long)]
        watch: bool,
    },
    /// Finish the current canary step now (`--full`: skip all remaining steps).
    Promote {
        name: String,
        #[arg(long)]
        full: bool,
    },
    /// Abort the rollout: all traffic back on stable.
    Abort { name: String },
    /// Restart an aborted rollout from the first step.
    Retry { name: String },
    /// Hold the rollout at its current step.
    Pause { name: String },
    /// Continue a paused rollout.
    Resume { name: String },
    /// List the kept stable revisions (newest first), for `undo --to-revision`.
    History { name: String },
    /// Go back to the previous stable revision (or `--to-revision N`): its pod-shaping spec
    /// fields are written back into the spec, which then rolls out like any change — or, when
    /// stable still runs that revision (after an abort), ends the rollout at once.
    Undo {
        name: String,
        #[arg(long)]
        to_revision: Option<i64>,
    },
    /// Rotate the namespace's managed CA now (phased; progress in `status.caRotation`).
    RotateCa {
        /// How long old and new CA are both trusted after leaves are reissued (e.g. 24h).
        #[arg(long)]
        overlap: Option<String>,
    },
    /// Wait for the rollout to finish; exit 0 when Ready, 1 when Degraded or aborted.
    Status {
        name: String,
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
}

/// The `--kubeconfig` and `--context` given, set once at start-up.
static CONNECTION: std::sync::OnceLock<(Option<std::path::PathBuf>, Option<String>)> = std::sync::OnceLock::new();

/// A client for the cluster the flags name (kubectl's own defaults without them).
async fn client() -> Result<Client, String> {
    use kube::config::{Config, KubeConfigOptions, Kubeconfig};
    let unreachable = |e: String| format!("cannot reach the cluster: {e}");
    let (path, context) = CONNECTION.get().cloned().unwrap_or_default();
    if path.is_none() && context.is_none() {
        return Client::try_default().await.map_err(|e| unreachable(e.to_string()));
    }
    let options = KubeConfigOptions {
        context,
        ..Default::default()
    };
    let config = match path {
        Some(p) => {
            let file = Kubeconfig::read_from(&p).map_err(|e| unreachable(format!("{}: {e}", p.display())))?;
            Config::from_custom_kubeconfig(file, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    };
    let config = config.map_err(|e| unreachable(e.to_string()))?;
    Client::try_from(config).map_err(|e| unreachable(e.to_string()))
}

async fn api(ns: &Option<String>) -> Result<Api<ProxyDeployment>, String> {
    let client = client().await?;
    Ok(match ns {
        Some(n) => Api::namespaced(client, n),
        None => Api::default_namespaced(client),
    })
}

async fn rotate_ca(ns: &Option<String>, overlap: Option<&str>) -> Result<(), String> {
    use proxyfleet_operator::certs::{ca::CA_SECRET, ca_rotation};
    let client = client().await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = match ns {
        Some(n) => Api::namespaced(client, n),
        None => Api::default_namespaced(client),
    };
    let secret = secrets
        .get(CA_SECRET)
        .await
        .map_err(|e| format!("secret/{CA_SECRET}: {e}"))?;
    if let Some(why) = rotation_refusal(&secret) {
        return Err(format!("secret/{CA_SECRET}: rotation not requested: {why}"));
    }
    let mut annotations = serde_json::Map::new();
    annotations.insert(ca_rotation::ROTATE_ANNOTATION.into(), "requested".into());
    if let Some(o) = overlap {
        o.parse::<proxyfleet_config::HumanDuration>()
            .map_err(|e| format!("--overlap {o}: {e}"))?;
        annotations.insert(ca_rotation::OVERLAP_ANNOTATION.into(), o.into());
    }
    // To the version read: a rotation the operator starts meanwhile is not asked for twice.
    let patch = serde_json::json!({"metadata": {
        "annotations": annotations,
        "resourceVersion": secret.metadata.resource_version,
    }});
    secrets
        .patch(CA_SECRET, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| format!("secret/{CA_SECRET}: {e} (read it again and retry)"))?;
    println!("secret/{CA_SECRET}: rotation requested; follow it with `kubectl get pxd -o custom-columns=NAME:.metadata.name,CA:.status.caRotation.phase`");
    Ok(())
}

/// Why a rotation of this CA Secret would not be taken as asked: a hub's copy is rotated on the
/// hub; one under way (or pending) would start another as soon as it is done.
fn rotation_refusal(secret: &k8s_openapi::api::core::v1::Secret) -> Option<String> {
    use proxyfleet_operator::certs::ca_rotation;
    let annotations = secret.metadata.annotations.clone().unwrap_or_default();
    if let Some(hub) = annotations.get(proxyfleet_operator::propagation::placement::HUB_OBJECT) {
        return Some(format!("this CA is the hub's ({hub}); rotate it on the hub cluster"));
    }
    let phase = annotations
        .get(ca_rotation::PHASE_ANNOTATION)
        .map(|p| ca_rotation::RotationPhase::parse(p))
        .unwrap_or_default();
    if phase != ca_rotation::STABLE {
        return Some(format!("a rotation is under way ({}); wait for Stable", phase.as_str()));
    }
    annotations
        .contains_key(ca_rotation::ROTATE_ANNOTATION)
        .then(|| "a rotation is already requested".to_string())
}

/// On a fleet whose placement has waves the verbs steer the rollout across clusters
/// (`retry` is `resume` there); otherwise the fleet's own canary. The command goes to the
/// version read; if the fleet changed meanwhile (a status write), it is read and sent again.
async fn command(api: &Api<ProxyDeployment>, name: &str, cmd: &str) -> Result<(), String> {
    for _ in 0..3 {
        match command_once(api, name, cmd).await {
            Err(Sent::Conflict) => continue,
            Err(Sent::Refused(why)) => return Err(why),
            Ok(said) => {
                println!("{said}");
                return Ok(());
            }
        }
    }
    Err(format!("{name}: it kept changing while {cmd} was sent; try again"))
}

enum Sent {
    /// The fleet changed since it was read.
    Conflict,
    Refused(String),
}

async fn command_once(api: &Api<ProxyDeployment>, name: &str, cmd: &str) -> Result<String, Sent> {
    let refused = |e: String| Sent::Refused(format!("{name}: {e}"));
    let pxd = api.get(name).await.map_err(|e| refused(e.to_string()))?;
    let waves = pxd.spec.placement.as_ref().is_some_and(|p| !p.waves.is_empty());
    if waves && cmd == "promote-full" {
        return Err(refused(
            "promote --full not sent: a rollout across waves moves a wave at a time (`promote` ends its soak or pause); no wave's analysis is skipped".into(),
        ));
    }
    let (annotation, verb) = match cmd {
        _ if !waves => (COMMAND_ANNOTATION, cmd),
        "retry" => (WAVE_COMMAND, "resume"),
        other => (WAVE_COMMAND, other),
    };
    if !waves {
        let st = pxd.status.as_ref();
        let degraded = st.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Degraded" && c.status == "True")
        });
        if let Some(c) = degraded.filter(|c| c.reason != "RolloutAborted") {
            eprintln!(
                "{name}: note: the fleet is held ({}): it acts on no command until that is fixed",
                c.reason
            );
        }
        if let Some(why) = proxyfleet_operator::verdict::command_refusal(st.and_then(|s| s.canary.as_ref()), cmd) {
            return Err(refused(format!("{cmd} not sent: {why}")));
        }
    }
    let patch = send_patch(&pxd.metadata, annotation, verb).map_err(refused)?;
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) if waves => Ok(format!(
            "proxydeployment/{name}: {verb} requested for the rollout across waves"
        )),
        Ok(_) => Ok(format!("proxydeployment/{name}: {cmd} requested")),
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Sent::Conflict),
        Err(e) => Err(refused(e.to_string())),
    }
}

/// A member cluster's copy of a hub fleet follows the hub's spec: a change made here is set
/// back by the hub's next sync, so it is refused, naming the hub's fleet.
fn refuse_member_copy(pxd: &ProxyDeployment, what: &str) -> Result<(), String> {
    let labels = pxd.metadata.labels.as_ref();
    if !labels.is_some_and(|l| l.contains_key(proxyfleet_operator::propagation::placement::HUB_UID)) {
        return Ok(());
    }
    let hub = pxd
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(proxyfleet_operator::propagation::placement::HUB_OBJECT))
        .map_or("the hub cluster's fleet", String::as_str);
    Err(format!(
        "{}: {what} not sent: this is a member cluster's copy of {hub}, whose next sync would set it back; run it on the hub",
        pxd.metadata.name.as_deref().unwrap_or("-")
    ))
}

/// The fleet and its kept stable revisions, newest first.
async fn with_revisions(
    api: &Api<ProxyDeployment>,
    name: &str,
) -> Result<(ProxyDeployment, Vec<ControllerRevision>), String> {
    let pxd = api.get(name).await.map_err(|e| format!("{name}: {e}"))?;
    let uid = pxd.metadata.uid.clone().unwrap_or_default();
    let ns = pxd.metadata.namespace.clone().unwrap_or_default();
    let crs: Api<ControllerRevision> = Api::namespaced(api.clone().into_client(), &ns);
    let mut list: Vec<ControllerRevision> = crs
        .list(&ListParams::default().labels(&format!("{}={name}", labels::INSTANCE)))
        .await
        .map_err(|e| format!("listing revisions of {name}: {e}"))?
        .items
        .into_iter()
        .filter(|c| proxyfleet_operator::owner_index::is_owned_by(c, &uid))
        .collect();
    list.sort_by_key(|c| std::cmp::Reverse(c.revision));
    Ok((pxd, list))
}

async fn history(api: &Api<ProxyDeployment>, name: &str) -> Result<(), String> {
    let (pxd, kept) = with_revisions(api, name).await?;
    let current = pxd.status.and_then(|s| s.revision);
    println!("{:<9} {:<10} {:<9} IMAGE", "REVISION", "HASH", "CURRENT");
    for c in kept {
        let hash = Kept::of(&c).map(|k| k.revision_hash).unwrap_or_default();
        let image = c
            .data
            .as_ref()
            .and_then(|d| d.0["spec"]["image"].as_str().map(str::to_string))
            .unwrap_or_else(|| "(operator default)".into());
        let mark = if current.as_deref() == Some(hash.as_str()) {
            "*"
        } else {
            ""
        };
        println!("{:<9} {:<10} {:<9} {image}", c.revision, hash, mark);
    }
    Ok(())
}

/// Sets the spec back to a kept revision. The patch holds only if the fleet is still the one
/// read (`undo_patch` tests its uid and generation), so the API server refuses it (422) after
/// any change in between. When that change left the template alone (a `kubectl scale`, an
/// HPA), the undo is worked out again from the fleet as it is then, a few times, rather than
/// failing on a race the user did not make; any other change (a sync, someone else's undo, the
/// fleet made again) fails it, since the undo would now go back from something else.
async fn undo(api: &Api<ProxyDeployment>, name: &str, to: Option<i64>) -> Result<(), String> {
    const ATTEMPTS: usize = 3;
    for attempt in 1..=ATTEMPTS {
        let (pxd, kept) = with_revisions(api, name).await?;
        refuse_member_copy(&pxd, "undo")?;
        let target = undo_target(&kept, &template_of(&pxd.spec), to).map_err(|e| e.to_string())?;
        let current = serde_json::to_value(&pxd).map_err(|e| format!("{name}: {e}"))?;
        let patch = undo_patch(target, &current).map_err(|e| e.to_string())?;
        match api
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => {
                println!(
                    "proxydeployment/{name}: spec set back to revision {} ({}); it rolls out like any change. \
                     With GitOps, revert the source too, or the next sync rolls forward again.",
                    target.revision,
                    target.metadata.name.as_deref().unwrap_or("-")
                );
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 422 && attempt < ATTEMPTS && only_scaled_since(api, &pxd).await => {
                eprintln!("proxydeployment/{name} was scaled while it was being undone; working the undo out again");
            }
            Err(e) => return Err(format!("{name}: {e}")),
        }
    }
    Err(format!("{name}: it kept changing while it was being undone; try again"))
}

/// Whether the fleet is the object `read` was, at another generation, with the same template:
/// only what no revision holds (replicas, strategy, service, placement) changed.
async fn only_scaled_since(api: &Api<ProxyDeployment>, read: &ProxyDeployment) -> bool {
    let name = read.metadata.name.as_deref().unwrap_or_default();
    match api.get(name).await {
        Ok(now) => {
            now.metadata.uid == read.metadata.uid
                && now.metadata.generation != read.metadata.generation
                && template_of(&now.spec) == template_of(&read.spec)
        }
        Err(_) => false,
    }
}

fn render(pxd: &ProxyDeployment, pods: &[Pod]) -> String {
    let mut out = String::new();
    let st = pxd.status.clone().unwrap_or_default();
    let name = pxd.metadata.name.clone().unwrap_or_default();
    out.push_str(&format!(
        "proxydeployment/{name}  phase={}  ready={}/{}  revision={}\n",
        st.phase.map(|p| p.as_str()).unwrap_or("-"),
        st.ready_replicas,
        pxd.spec.replicas,
        st.revision.as_deref().unwrap_or("-")
    ));
    for c in &st.conditions {
        out.push_str(&format!(
            "├─ condition {}={} ({}) {}\n",
            c.type_, c.status, c.reason, c.message
        ));
    }
    if let Some(canary) = &st.canary {
        let strategy = pxd.spec.strategy.as_ref().and_then(|s| s.canary.as_ref());
        out.push_str(&proxyfleet_operator::canary::tree::render(strategy, canary));
    }
    if let Some(waves) = &st.waves {
        out.push_str(&proxyfleet_operator::propagation::wave_tree::render(
            waves,
            &st.clusters,
        ));
    }
    for c in &st.certificates {
        out.push_str(&format!(
            "├─ certificate {} {} serial={} notAfter={}\n",
            c.kind,
            c.secret_name,
            c.serial.as_deref().unwrap_or("-"),
            c.not_after.as_deref().unwrap_or("-")
        ));
    }
    out.push_str("└─ pods\n");
    for p in pods {
        let l = p.metadata.labels.clone().unwrap_or_default();
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status == "True")
            .unwrap_or(false);
        out.push_str(&format!(
            "   ├─ {} track={} revision={} {}\n",
            p.metadata.name.as_deref().unwrap_or("-"),
            l.get(labels::TRACK).map(String::as_str).unwrap_or("-"),
            l.get(labels::REVISION).map(String::as_str).unwrap_or("-"),
            if ready { "Ready" } else { "NotReady" }
        ));
    }
    out
}

async fn get(api: &Api<ProxyDeployment>, ns: &Option<String>, name: &str, watch: bool) -> Result<(), String> {
    let client = client().await?;
    let pods: Api<Pod> = match ns {
        Some(n) => Api::namespaced(client, n),
        None => Api::default_namespaced(client),
    };
    loop {
        let pxd = api.get(name).await.map_err(|e| format!("{name}: {e}"))?;
        let list = pods
            .list(&ListParams::default().labels(&format!("{}={name}", labels::INSTANCE)))
            .await
            .map_err(|e| e.to_string())?;
        let text = render(&pxd, &list.items);
        if watch {
            print!("\x1b[2J\x1b[H");
        }
        println!("{text}");
        if !watch {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn status(api: &Api<ProxyDeployment>, name: &str, timeout: u64) -> ExitCode {
    use proxyfleet_operator::verdict::of_fleet;
    proxyfleet_operator::verdict_wait::wait(name, Duration::from_secs(timeout), || async {
        Ok(of_fleet(&api.get(name).await?))
    })
    .await
}

/// The verbs aimed at an AppRollout (`approllout/NAME`, or `get apr NAME`); None otherwise.
async fn app_command(cli: &Cli) -> Option<ExitCode> {
    use proxyfleet_operator::app::cli as app;
    let (name, verb) = match &cli.command {
        Cmd::Get { kind, name, .. } if matches!(kind.as_str(), "apr" | "approllout" | "approllouts") => {
            (name.as_str(), "get")
        }
        Cmd::Get { name, .. } => (app::app_name(name)?, "get"),
        Cmd::Promote { name, full } => (app::app_name(name)?, if *full { "promote-full" } else { "promote" }),
        Cmd::Abort { name } => (app::app_name(name)?, "abort"),
        Cmd::Retry { name } => (app::app_name(name)?, "retry"),
        Cmd::Pause { name } => (app::app_name(name)?, "pause"),
        Cmd::Resume { name } => (app::app_name(name)?, "resume"),
        Cmd::Status { name, .. } => (app::app_name(name)?, "status"),
        _ => return None,
    };
    let client = match client().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return Some(ExitCode::FAILURE);
        }
    };
    let api: Api<proxyfleet_operator::app::spec::AppRollout> = match &cli.namespace {
        Some(n) => Api::namespaced(client, n),
        None => Api::default_namespaced(client),
    };
    let result = match (&cli.command, verb) {
        (Cmd::Status { timeout, .. }, _) => return Some(app::status(&api, name, *timeout).await),
        (Cmd::Get { watch, .. }, _) => app::get(&api, name, *watch).await,
        (_, cmd) => app::command(&api, name, cmd).await,
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    quiet_on_closed_stdout();
    proxyfleet_operator::crypto::install_provider();
    let cli = Cli::parse();
    let _ = CONNECTION.set((cli.kubeconfig.clone(), cli.context.clone()));
    let api = match api(&cli.namespace).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(code) = app_command(&cli).await {
        return code;
    }
    let result = match &cli.command {
        Cmd::Get { kind, name, watch } => {
            if !matches!(kind.as_str(), "pxd" | "proxydeployment" | "proxydeployments") {
                eprintln!("only `get pxd NAME` is supported");
                return ExitCode::FAILURE;
            }
            get(&api, &cli.namespace, name, *watch).await
        }
        Cmd::Promote { name, full } => command(&api, name, if *full { "promote-full" } else { "promote" }).await,
        Cmd::Abort { name } => command(&api, name, "abort").await,
        Cmd::Retry { name } => command(&api, name, "retry").await,
        Cmd::Pause { name } => command(&api, name, "pause").await,
        Cmd::Resume { name } => command(&api, name, "resume").await,
        Cmd::Status { name, timeout } => return status(&api, name, *timeout).await,
        Cmd::History { name } => history(&api, name).await,
        Cmd::Undo { name, to_revision } => undo(&api, name, *to_revision).await,
        Cmd::RotateCa { overlap } => rotate_ca(&cli.namespace, overlap.as_deref()).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// A closed stdout (`kubectl proxyfleet get … | head`, `| grep -q`) ends the command quietly,
/// as it ends other command-line tools, instead of a panic in `println!`.
fn quiet_on_closed_stdout() {
    // SAFETY: sets the process-wide disposition of SIGPIPE back to the default; no handler
    // (no code that could run on a signal) is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;
    use proxyfleet_operator::certs::ca_rotation;

    fn secret(annotations: &[(&str, &str)]) -> Secret {
        let mut s = Secret::default();
        s.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s
    }

    #[test]
    fn a_rotation_is_asked_only_of_a_stable_ca_of_this_cluster() {
        assert_eq!(rotation_refusal(&secret(&[])), None);
        assert_eq!(
            rotation_refusal(&secret(&[(ca_rotation::PHASE_ANNOTATION, "Stable")])),
            None
        );
        let under_way = rotation_refusal(&secret(&[(ca_rotation::PHASE_ANNOTATION, "Overlap")]));
        assert!(under_way.is_some_and(|w| w.contains("Overlap")));
        assert!(rotation_refusal(&secret(&[(ca_rotation::ROTATE_ANNOTATION, "requested")])).is_some());
        let hub = rotation_refusal(&secret(&[(
            proxyfleet_operator::propagation::placement::HUB_OBJECT,
            "team-a/edge",
        )]));
        assert!(hub.is_some_and(|w| w.contains("team-a/edge")));
    }

    #[test]
    fn undo_is_refused_on_a_member_copy_naming_the_hub_fleet() {
        use proxyfleet_operator::propagation::placement::{HUB_OBJECT, HUB_UID};
        let mut pxd: ProxyDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyDeployment",
            "metadata": {"name": "edge"},
            "spec": {"replicas": 1, "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}],
                     "routes": [{"name": "all", "upstream": "u"}],
                     "upstreams": [{"name": "u", "endpoints": ["u:80"]}]}
        }))
        .expect("a fleet");
        assert!(refuse_member_copy(&pxd, "undo").is_ok());
        pxd.metadata.labels = Some([(HUB_UID.to_string(), "abc".to_string())].into());
        pxd.metadata.annotations = Some([(HUB_OBJECT.to_string(), "team-a/edge".to_string())].into());
        assert!(refuse_member_copy(&pxd, "undo").is_err_and(|e| e.contains("team-a/edge")));
    }

    fn fleet(timeout: &str, replicas: i32, generation: i64) -> ProxyDeployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyDeployment",
            "metadata": {"name": "edge", "namespace": "team", "uid": "uid-edge", "generation": generation},
            "spec": {"replicas": replicas, "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}],
                     "routes": [{"name": "all", "upstream": "u", "timeout": timeout}],
                     "upstreams": [{"name": "u", "endpoints": ["u:80"]}]}
        }))
        .expect("a fleet")
    }

    type Mocked = (
        Api<ProxyDeployment>,
        tower_test::mock::Handle<http::Request<kube::client::Body>, http::Response<kube::client::Body>>,
    );

    /// The fleet's API on a mocked API server, and the server's handle.
    fn mocked() -> Mocked {
        let (mock, handle) = tower_test::mock::pair();
        (Api::namespaced(Client::new(mock, "team"), "team"), handle)
    }

    /// The kept revisions: the route's timeout 4s (revision 1), then 5s (revision 2).
    fn records() -> serde_json::Value {
        let owner = proxyfleet_operator::resources::Owner::of(&fleet("4s", 1, 1)).expect("owner");
        serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": [
            proxyfleet_operator::history::record(&owner, &fleet("4s", 1, 1).spec, "old", 1),
            proxyfleet_operator::history::record(&owner, &fleet("5s", 1, 2).spec, "cur", 2),
        ]})
    }

    /// The API server's answer to a JSON patch whose test failed.
    fn test_failed() -> serde_json::Value {
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "the server rejected our request due to an error in our request", "reason": "Invalid", "code": 422})
    }

    fn answer(
        send: tower_test::mock::SendResponse<http::Response<kube::client::Body>>,
        code: u16,
        v: serde_json::Value,
    ) {
        let body = kube::client::Body::from(serde_json::to_vec(&v).expect("json"));
        send.send_response(http::Response::builder().status(code).body(body).expect("response"));
    }

    /// Against a mocked API server: a `kubectl scale` between the undo's read and its patch makes
    /// the patch's generation test fail (422); the undo reads the fleet again and patches it as
    /// it is then, instead of failing on a race the user did not make.
    #[tokio::test]
    async fn an_undo_raced_by_a_scale_is_worked_out_again() {
        use http_body_util::BodyExt;
        let (api, mut handle) = mocked();
        let (records, invalid) = (records(), test_failed());
        let server = tokio::spawn(async move {
            let mut patches = Vec::new();
            let (before, after) = (fleet("5s", 1, 2), fleet("5s", 3, 3));
            let script = [
                ("GET", 200, serde_json::to_value(&before).expect("json")),
                ("GET", 200, records.clone()),
                ("PATCH", 422, invalid),
                ("GET", 200, serde_json::to_value(&after).expect("json")),
                ("GET", 200, serde_json::to_value(&after).expect("json")),
                ("GET", 200, records),
                ("PATCH", 200, serde_json::to_value(&after).expect("json")),
            ];
            for (method, code, v) in script {
                let (request, send) = handle.next_request().await.expect("a request");
                assert_eq!(request.method().as_str(), method, "{}", request.uri());
                if method == "PATCH" {
                    let body = request.into_body().collect().await.expect("body").to_bytes();
                    patches.push(String::from_utf8_lossy(&body).into_owned());
                }
                answer(send, code, v);
            }
            patches
        });
        undo(&api, "edge", None).await.expect("the undo, worked out again");
        let patches = server.await.expect("the server");
        assert!(
            patches[0].contains(r#""path":"/metadata/generation","value":2"#),
            "{}",
            patches[0]
        );
        assert!(
            patches[1].contains(r#""path":"/metadata/generation","value":3"#),
            "{}",
            patches[1]
        );
        assert!(patches[1].contains(r#""timeout":"4s""#), "{}", patches[1]);
    }

    /// A change of the template in between (a sync, someone else's undo) is not undone over:
    /// the undo fails, saying why, after one read.
    #[tokio::test]
    async fn an_undo_raced_by_a_template_change_fails() {
        let (api, mut handle) = mocked();
        let server = tokio::spawn(async move {
            let script = [
                (200, serde_json::to_value(fleet("5s", 1, 2)).expect("json")),
                (200, records()),
                (422, test_failed()),
                (200, serde_json::to_value(fleet("6s", 1, 3)).expect("json")),
            ];
            for (code, v) in script {
                let (_, send) = handle.next_request().await.expect("a request");
                answer(send, code, v);
            }
            assert!(handle.next_request().await.is_none(), "nothing more");
        });
        let err = undo(&api, "edge", None)
            .await
            .expect_err("not undone over another change");
        assert!(
            err.contains("edge") && err.contains("rejected our request"),
            "the 422, as it came: {err}"
        );
        drop(api);
        server.await.expect("the server");
    }
}
