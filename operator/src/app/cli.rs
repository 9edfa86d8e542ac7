//! `kubectl proxyfleet` for AppRollouts (`approllout/NAME` or `apr/NAME`): the same verbs as
//! for fleets — get [--watch], promote [--full], abort, retry, pause, resume, status.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};

use super::spec::AppRollout;
use crate::canary::rollout::COMMAND_ANNOTATION;
use crate::canary::spec::CanaryPhase;

/// The AppRollout a plugin argument names, if it names one.
pub fn app_name(arg: &str) -> Option<&str> {
    arg.strip_prefix("approllout/")
        .or_else(|| arg.strip_prefix("apr/"))
        .or_else(|| arg.strip_prefix("approllouts/"))
}

pub async fn command(api: &Api<AppRollout>, name: &str, cmd: &str) -> Result<(), String> {
    let ar = api.get(name).await.map_err(|e| format!("approllout/{name}: {e}"))?;
    let patch = crate::command_annotation::send_patch(&ar.metadata, COMMAND_ANNOTATION, cmd)
        .map_err(|e| format!("approllout/{name}: {e}"))?;
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| format!("approllout/{name}: {e}"))?;
    println!("approllout/{name}: {cmd} requested");
    Ok(())
}

pub fn render(ar: &AppRollout) -> String {
    let st = ar.status.clone().unwrap_or_default();
    let name = ar.metadata.name.clone().unwrap_or_default();
    let mut out = format!(
        "approllout/{name}  workload=deployment/{}  route={}/{}  weight={}%  stable={}  weights applied on {} proxy pods\n",
        ar.spec.workload_ref.name,
        ar.spec.route.proxy_deployment,
        ar.spec.route.name,
        st.weight,
        st.stable_revision.as_deref().unwrap_or("-"),
        st.weights_applied.as_deref().unwrap_or("-"),
    );
    for c in &st.conditions {
        out.push_str(&format!(
            "├─ condition {}={} ({}) {}\n",
            c.type_, c.status, c.reason, c.message
        ));
    }
    if let Some(canary) = &st.canary {
        out.push_str(&crate::canary::tree::render(Some(&ar.spec.strategy), canary));
    }
    out
}

pub async fn get(api: &Api<AppRollout>, name: &str, watch: bool) -> Result<(), String> {
    loop {
        let ar = api.get(name).await.map_err(|e| format!("approllout/{name}: {e}"))?;
        if watch {
            print!("\x1b[2J\x1b[H");
        }
        println!("{}", render(&ar));
        if !watch {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Waits for the rollout to end: 0 when the new version is stable (or nothing rolls out),
/// 1 when it was aborted, 2 on timeout.
pub async fn status(api: &Api<AppRollout>, name: &str, timeout: u64) -> ExitCode {
    let deadline = Instant::now() + Duration::from_secs(timeout);
    loop {
        match api.get(name).await {
            Ok(ar) => {
                let st = ar.status.clone().unwrap_or_default();
                let current = st.observed_generation == ar.metadata.generation;
                match st.canary.as_ref().map(|c| c.phase) {
                    Some(CanaryPhase::Aborted) if current => {
                        let msg = st.canary.and_then(|c| c.message).unwrap_or_default();
                        println!("approllout/{name}: Aborted: {msg}");
                        return ExitCode::from(1);
                    }
                    Some(CanaryPhase::Completed | CanaryPhase::Idle) if current => {
                        println!(
                            "approllout/{name}: stable at {}",
                            st.stable_revision.unwrap_or_default()
                        );
                        return ExitCode::SUCCESS;
                    }
                    _ => {}
                }
            }
            Err(e) => eprintln!("approllout/{name}: {e}"),
        }
        if Instant::now() > deadline {
            println!("approllout/{name}: timed out");
            return ExitCode::from(2);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
