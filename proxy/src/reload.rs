//! Hot reload: the config file and every certificate, key and bundle directory are watched
//! (Kubernetes updates a mounted Secret by swapping a symlink in its directory); SIGHUP forces
//! a reload. A reload builds a whole new state; if anything fails the running state stays.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use proxyfleet_config::ProxyConfig;

use crate::metrics::ResultLabels;
use crate::server::{read_config, Shared};
use crate::state::ProxyState;
use crate::tls::parent_dirs;

/// Files whose change means a reload: the config itself and all TLS material it names.
fn watched_dirs(config: &ProxyConfig, config_path: Option<&PathBuf>) -> Vec<PathBuf> {
    let mut files: Vec<&str> = Vec::new();
    for l in &config.listeners {
        if let Some(t) = &l.tls {
            for c in &t.certificates {
                files.push(&c.cert_file);
                files.push(&c.key_file);
            }
            if let Some(ca) = &t.client_ca_file {
                files.push(ca);
            }
        }
    }
    for u in &config.upstreams {
        if let Some(t) = &u.tls {
            if let Some(ca) = &t.ca_file {
                files.push(ca);
            }
            if let Some(c) = &t.client_certificate {
                files.push(&c.cert_file);
                files.push(&c.key_file);
            }
        }
    }
    files.extend(config.trust_bundle_files.iter().map(String::as_str));
    let config_path = config_path.and_then(|p| p.to_str());
    parent_dirs(files.into_iter().chain(config_path))
}

fn count_failure(shared: &Shared) {
    shared
        .metrics
        .reloads
        .get_or_create(&ResultLabels { result: "failure" })
        .inc();
}

/// Reloads from disk now. Returns whether the new state was taken.
pub fn reload(shared: &Shared) -> bool {
    let current = shared.state.load_full();
    let config = match &shared.config_path {
        Some(path) => match read_config(path) {
            Ok(c) => c,
            Err(e) => {
                count_failure(shared);
                tracing::error!(error = %e, "reload refused; keeping the running configuration");
                return false;
            }
        },
        None => current.config.clone(),
    };
    if config.listeners != current.config.listeners
        && config
            .listeners
            .iter()
            .map(|l| &l.address)
            .ne(current.config.listeners.iter().map(|l| &l.address))
    {
        count_failure(shared);
        tracing::error!(
            "reload refused: listener addresses changed; that needs a restart (the operator rolls pods for it)"
        );
        return false;
    }
    match ProxyState::build(config, Some(&current), &shared.metrics, &shared.resumption) {
        Ok(next) => {
            next.publish_metrics(&shared.metrics);
            let serials: Vec<_> = next
                .certificates
                .iter()
                .map(|(l, c)| format!("{l}:{}", c.serial))
                .collect();
            shared.state.store(Arc::new(next));
            shared
                .metrics
                .reloads
                .get_or_create(&ResultLabels { result: "success" })
                .inc();
            tracing::info!(certificates = ?serials, "reloaded");
            true
        }
        Err(e) => {
            count_failure(shared);
            tracing::error!(error = %e, "reload failed; keeping the running state");
            false
        }
    }
}

/// Watches files and SIGHUP for the life of the process.
pub async fn watch(shared: Arc<Shared>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    #[cfg(unix)]
    {
        let tx = tx.clone();
        tokio::spawn(async move {
            let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
                return;
            };
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading");
                let _ = tx.send(());
            }
        });
    }
    let mut watcher = make_watcher(&shared, tx.clone());
    while rx.recv().await.is_some() {
        // Debounce: a Secret update is several events (new dir, symlink swap, old dir removed).
        tokio::time::sleep(Duration::from_millis(200)).await;
        while rx.try_recv().is_ok() {}
        let s = shared.clone();
        let changed = tokio::task::spawn_blocking(move || reload(&s)).await.unwrap_or(false);
        if changed {
            // New paths may need watching.
            watcher = make_watcher(&shared, tx.clone());
        }
    }
    drop(watcher);
}

fn make_watcher(shared: &Shared, tx: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    let dirs = watched_dirs(&shared.state.load().config, shared.config_path.as_ref());
    let mut watcher = match notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev {
            if !matches!(ev.kind, notify::EventKind::Access(_)) {
                let _ = tx.send(());
            }
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch files; only SIGHUP reloads");
            return None;
        }
    };
    for d in dirs {
        if let Err(e) = watcher.watch(&d, RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %d.display(), error = %e, "cannot watch directory");
        }
    }
    Some(watcher)
}
