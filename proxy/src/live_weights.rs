//! Live weights: a route's backend weights changed at run time, from the admin listener
//! (`PUT /weights`, pushed by the operator) or from `*.json` documents in a watched directory
//! (the mounted ConfigMap a restarted proxy starts from). Neither reloads the configuration:
//! the route's weight table is swapped, so no connection is dropped. The latest document per
//! route is kept and applied again to every state a reload builds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use proxyfleet_config::{check_live_weights, LiveWeights};
use tokio::sync::mpsc;

use crate::shared::Shared;
use crate::state::ProxyState;

/// What became of a document.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// The same generation is already in force.
    Unchanged,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no route named {0:?}")]
    UnknownRoute(String),
    #[error("route {route:?}: {reason}")]
    Invalid { route: String, reason: String },
    #[error("route {route:?}: generation {given} is older than the applied {applied}")]
    Stale { route: String, given: u64, applied: u64 },
    /// A generation is one set of weights: another document under the applied one is refused,
    /// so its sender learns it was not taken (and moves the generation on).
    #[error("route {route:?}: generation {generation} is already applied with other weights")]
    Conflict { route: String, generation: u64 },
}

/// Checks `doc` against the running configuration and applies it.
pub fn apply(shared: &Shared, doc: LiveWeights) -> Result<Outcome, Refused> {
    // Locked before the state is read: a reload publishes its state under this lock, so the
    // document lands in the state that serves, or is carried over into the next one.
    let mut latest = shared.live_weights.lock().unwrap_or_else(|p| p.into_inner());
    let state = shared.state.load();
    let Some((config, split)) = state
        .config
        .routes
        .iter()
        .zip(&state.routes)
        .find(|(r, _)| r.name == doc.route)
        .and_then(|(r, c)| Some((r, c.split.as_ref()?)))
    else {
        return Err(if state.config.routes.iter().any(|r| r.name == doc.route) {
            Refused::Invalid {
                route: doc.route.clone(),
                reason: "the route has no backends to weigh".into(),
            }
        } else {
            Refused::UnknownRoute(doc.route.clone())
        });
    };
    check_live_weights(config, &doc).map_err(|reason| Refused::Invalid {
        route: doc.route.clone(),
        reason,
    })?;
    if let Some(applied) = latest.get(&doc.route) {
        if doc.generation < applied.generation {
            return Err(Refused::Stale {
                route: doc.route.clone(),
                given: doc.generation,
                applied: applied.generation,
            });
        }
        if doc.generation == applied.generation {
            return if applied.weights == doc.weights && applied.overrides == doc.overrides {
                split.apply(&doc); // idempotent; the answer then holds of the state serving
                Ok(Outcome::Unchanged)
            } else {
                Err(Refused::Conflict {
                    route: doc.route.clone(),
                    generation: doc.generation,
                })
            };
        }
    }
    split.apply(&doc);
    tracing::info!(route = %doc.route, generation = doc.generation, weights = ?doc.weights, "live weights applied");
    latest.insert(doc.route.clone(), doc);
    Ok(Outcome::Applied)
}

/// Applies the kept documents to a state a reload just built, before it serves a request.
pub fn carry_over(latest: &HashMap<String, LiveWeights>, state: &ProxyState) {
    for (config, route) in state.config.routes.iter().zip(&state.routes) {
        let (Some(doc), Some(split)) = (latest.get(&config.name), route.split.as_ref()) else {
            continue;
        };
        if check_live_weights(config, doc).is_ok() {
            split.apply(doc);
        }
    }
}

/// The documents in force, for the admin report.
pub fn report(shared: &Shared) -> Vec<LiveWeights> {
    let state = shared.state.load();
    let mut out: Vec<LiveWeights> = state
        .routes
        .iter()
        .filter_map(|r| r.split.as_ref()?.live(&r.name))
        .collect();
    out.sort_by(|a, b| a.route.cmp(&b.route));
    out
}

/// Reads every `*.json` document of a directory (unreadable or invalid ones are logged).
fn read_dir(dir: &Path) -> Vec<LiveWeights> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        match std::fs::read_to_string(&path).map(|t| LiveWeights::from_json(&t)) {
            Ok(Ok(doc)) => out.push(doc),
            Ok(Err(e)) => tracing::warn!(file = %path.display(), error = %e, "live weights document refused"),
            Err(e) => tracing::warn!(file = %path.display(), error = %e, "cannot read live weights"),
        }
    }
    out
}

/// Applies what the directory holds now.
pub fn apply_dir(shared: &Shared, dir: &Path) {
    for doc in read_dir(dir) {
        match apply(shared, doc) {
            // What was pushed since wins over the kept file.
            Ok(_) | Err(Refused::Stale { .. } | Refused::Conflict { .. }) => {}
            Err(e) => tracing::warn!(error = %e, dir = %dir.display(), "live weights from file refused"),
        }
    }
}

/// Applies the directory now and whenever it changes (the kubelet swaps `..data`).
pub fn spawn_watch(shared: Arc<Shared>, dir: PathBuf) {
    apply_dir(&shared, &dir);
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
            let _ = tx.send(());
        }
    });
    let mut watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch the live weights directory");
            return;
        }
    };
    if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the live weights directory");
    }
    tokio::spawn(async move {
        let _watcher = watcher;
        while rx.recv().await.is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            while rx.try_recv().is_ok() {}
            apply_dir(&shared, &dir);
        }
    });
}
