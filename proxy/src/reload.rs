//! Hot reload: the config file and every certificate, key and bundle directory are watched
//! (Kubernetes updates a mounted Secret by swapping a symlink in its directory); SIGHUP forces
//! a reload. A reload builds a whole new state; if anything fails the running state stays.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use proxyfleet_config::ProxyConfig;

use crate::config_file::read_config;
use crate::metrics::ResultLabels;
use crate::shared::Shared;
use crate::state::ProxyState;
use crate::tls::parent_dirs;

/// A SIGHUP came since the configuration was first read (`forget_hangups`) and before the
/// watcher listens: noted by `note_hangup`, the handler the binary installs before any code of
/// its own runs, and answered by the watcher when it starts.
static HANGUP_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The SIGHUP handler from process start: it only notes the signal (an atomic store is
/// async-signal-safe). Tokio's handler, registered by the watcher, calls it too.
#[cfg(unix)]
pub extern "C" fn note_hangup(_: libc::c_int) {
    HANGUP_SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Forgets the SIGHUPs noted so far: the configuration is about to be read.
pub fn forget_hangups() {
    HANGUP_SEEN.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// Files whose change means a reload: the config itself and all TLS material it names.
/// Returns the directories to watch and the file names that matter in them.
fn watched(config: &ProxyConfig, config_path: Option<&PathBuf>) -> (Vec<PathBuf>, Vec<std::ffi::OsString>) {
    let mut files: Vec<&str> = Vec::new();
    for l in &config.listeners {
        if let Some(t) = &l.tls {
            for c in &t.certificates {
                files.push(&c.cert_file);
                files.push(&c.key_file);
                files.extend(c.ocsp_file.as_deref());
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
    files.extend(
        config
            .routes
            .iter()
            .filter_map(|r| r.jwt.as_ref()?.jwks_file.as_deref()),
    );
    files.extend(
        config
            .routes
            .iter()
            .filter_map(|r| r.grpc_transcoding.as_ref()?.descriptor_set_file.as_deref()),
    );
    let socks5_dirs: Vec<&str> = config
        .listeners
        .iter()
        .filter_map(|l| l.tcp.as_ref()?.socks5.as_ref()?.credentials_dir.as_deref())
        .collect();
    let socks5_files: Vec<String> = socks5_dirs
        .iter()
        .flat_map(|d| {
            [
                proxyfleet_config::SOCKS5_USERNAME_FILE,
                proxyfleet_config::SOCKS5_PASSWORD_FILE,
            ]
            .map(|f| format!("{d}/{f}"))
        })
        .collect();
    files.extend(socks5_files.iter().map(String::as_str));
    let config_path = config_path.and_then(|p| p.to_str());
    let all: Vec<&str> = files.into_iter().chain(config_path).collect();
    let names = all
        .iter()
        .filter_map(|f| std::path::Path::new(f).file_name().map(|n| n.to_os_string()))
        .collect();
    (parent_dirs(all.into_iter()), names)
}

/// Whether a file event concerns what we load. Kubernetes updates a mounted Secret or ConfigMap
/// by swapping the `..data` symlink, so `..`-prefixed names count too. Anything else in the
/// directory (a log file, say) must not cause reloads.
fn relevant(event: &notify::Event, names: &[std::ffi::OsString]) -> bool {
    !matches!(event.kind, notify::EventKind::Access(_))
        && event.paths.iter().any(|p| {
            p.file_name()
                .is_some_and(|n| names.iter().any(|w| w == n) || n.to_str().is_some_and(|s| s.starts_with("..")))
        })
}

fn count_failure(shared: &Shared) {
    shared
        .metrics
        .reloads
        .get_or_create(&ResultLabels { result: "failure" })
        .inc();
    shared.metrics.last_reload_successful.set(0);
}

/// What a running proxy cannot change in place, the first that differs: its sockets, accept
/// loops, connection builders and workers are made once, from the configuration it started
/// with. Taking such a change would half-apply it (a renamed listener dropping every
/// connection, a limit silently kept), so a reload keeps these parts as they run
/// (`keep_running_shape`), says what waits for a restart, and takes the rest.
pub fn needs_restart(old: &ProxyConfig, new: &ProxyConfig) -> Option<&'static str> {
    let same_shape = |a: &proxyfleet_config::Listener, b: &proxyfleet_config::Listener| {
        a.name == b.name
            && a.address == b.address
            && a.tls.as_ref().map(|t| &t.http3) == b.tls.as_ref().map(|t| &t.http3)
            && a.https_redirect == b.https_redirect
            && a.access_log == b.access_log
            && a.tcp.is_some() == b.tcp.is_some()
    };
    // By name, as the running proxy finds its listeners: a reordered file changes nothing.
    let listeners_kept = old.listeners.len() == new.listeners.len()
        && new
            .listeners
            .iter()
            .all(|b| old.listeners.iter().any(|a| same_shape(a, b)));
    let limits = |c: &ProxyConfig| {
        let l = &c.limits;
        (
            l.max_connections,
            l.header_read_timeout,
            l.max_header_bytes,
            l.http2.clone(),
        )
    };
    if !listeners_kept {
        Some("listeners: name, address, tls on or off, tls.http3, httpsRedirect, accessLog or tcp")
    } else if limits(old) != limits(new) {
        Some("limits: maxConnections, headerReadTimeout, maxHeaderBytes or http2")
    } else if old.admin != new.admin {
        Some("admin")
    } else if (old.worker_threads, old.idle_spin_micros) != (new.worker_threads, new.idle_spin_micros) {
        Some("workerThreads or idleSpinMicros")
    } else {
        None
    }
}

/// The new configuration with what `needs_restart` names kept as the proxy runs it: every
/// running listener keeps its name, address, redirect, access log, TCP mode and HTTP/3 (and
/// its TLS, when the new file turns TLS on or off) and takes the rest (certificates, client
/// CA, resumption, TCP targets) from the listener of the same name in the new file, or else
/// from the one at its position (a renamed listener); one the new file adds waits for the
/// restart. Limits the connection builders hold, the admin listener and the workers stay too.
/// Certificates, routes and upstreams are never held back by a change elsewhere that needs a
/// restart.
pub fn keep_running_shape(old: &ProxyConfig, mut new: ProxyConfig) -> ProxyConfig {
    let listeners = old
        .listeners
        .iter()
        .enumerate()
        .map(|(i, running)| {
            let by_name = new.listeners.iter().find(|l| l.name == running.name);
            match by_name.or_else(|| new.listeners.get(i)) {
                Some(wanted) => keep_listener_shape(running, wanted),
                None => running.clone(),
            }
        })
        .collect();
    new.listeners = listeners;
    let (l, running) = (&mut new.limits, &old.limits);
    l.max_connections = running.max_connections;
    l.header_read_timeout = running.header_read_timeout;
    l.max_header_bytes = running.max_header_bytes;
    l.http2.clone_from(&running.http2);
    new.admin.clone_from(&old.admin);
    new.worker_threads = old.worker_threads;
    new.idle_spin_micros = old.idle_spin_micros;
    new
}

fn keep_listener_shape(
    running: &proxyfleet_config::Listener,
    wanted: &proxyfleet_config::Listener,
) -> proxyfleet_config::Listener {
    let tls = match (&running.tls, &wanted.tls) {
        (Some(r), Some(w)) => Some(proxyfleet_config::ListenerTls {
            http3: r.http3.clone(),
            ..w.clone()
        }),
        _ => running.tls.clone(),
    };
    let tcp = if running.tcp.is_some() == wanted.tcp.is_some() {
        wanted.tcp.clone()
    } else {
        running.tcp.clone()
    };
    proxyfleet_config::Listener {
        tls,
        tcp,
        ..running.clone()
    }
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
    let pending = needs_restart(&current.config, &config);
    let config = match pending {
        Some(what) => {
            tracing::warn!(
                waiting = what,
                "part of this change needs a restart (the operator rolls pods for it): that part keeps its running value, the rest is taken"
            );
            keep_running_shape(&current.config, config)
        }
        None => config,
    };
    match ProxyState::build(config, Some(&current), &shared.metrics, &shared.resumption) {
        Ok(next) => {
            next.publish_metrics(&shared.metrics);
            let serials: Vec<_> = next
                .certificates
                .iter()
                .map(|(l, c)| format!("{l}:{}", c.serial))
                .collect();
            // Carried over and published under one lock: a weights push in between would
            // land in the state being replaced and be lost.
            let latest = shared.live_weights.lock().unwrap_or_else(|p| p.into_inner());
            crate::live_weights::carry_over(&latest, &next);
            let next = Arc::new(next);
            shared.state.store(next.clone());
            drop(latest);
            next.retire_replaced(&current);
            shared
                .metrics
                .reloads
                .get_or_create(&ResultLabels { result: "success" })
                .inc();
            shared.metrics.last_reload_successful.set(1);
            shared.metrics.restart_pending.set(i64::from(pending.is_some()));
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

/// Watches files and SIGHUP for the life of the process. The file watches are in place when
/// this returns, so a change made right after start-up is never missed.
pub fn spawn_watch(shared: Arc<Shared>) {
    let (tx, rx) = mpsc::unbounded_channel::<()>();
    let watching = make_watcher(to_watch(&shared), tx.clone());
    tokio::spawn(watch(shared, tx, rx, watching));
}

/// What is watched (the directories a watch was placed on, and the file names that matter in
/// them), and the watcher.
type Watching = (ToWatch, Option<notify::RecommendedWatcher>);
type ToWatch = (Vec<PathBuf>, Vec<std::ffi::OsString>);

async fn watch(
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<()>,
    mut rx: mpsc::UnboundedReceiver<()>,
    mut watching: Watching,
) {
    #[cfg(unix)]
    listen_for_hangups(&tx);
    while rx.recv().await.is_some() {
        // Debounce: a Secret update is several events (new dir, symlink swap, old dir removed).
        tokio::time::sleep(Duration::from_millis(200)).await;
        while rx.try_recv().is_ok() {}
        let s = shared.clone();
        let wanted = tokio::task::spawn_blocking(move || {
            reload(&s);
            to_watch(&s)
        })
        .await;
        // Paths named by the file are watched even when its reload failed: the certificate
        // it waits for may arrive in a directory the running configuration does not name. A
        // directory that could not be watched (not there yet) is tried again.
        if let Ok(wanted) = wanted {
            if wanted != watching.0 {
                let before = std::mem::take(&mut watching.0 .0);
                watching = make_watcher(wanted, tx.clone());
                // What arrived in a newly watched directory before its watch is read now.
                if watching.0 .0.iter().any(|d| !before.contains(d)) {
                    let _ = tx.send(());
                }
            }
        }
    }
    drop(watching);
}

/// Answers SIGHUPs: one noted during start-up at once, later ones as they come.
#[cfg(unix)]
fn listen_for_hangups(tx: &mpsc::UnboundedSender<()>) {
    // Listening first: a SIGHUP from here on is the listener's, one before it was noted.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    if HANGUP_SEEN.swap(false, std::sync::atomic::Ordering::Relaxed) {
        tracing::info!("SIGHUP during start-up: reloading");
        let _ = tx.send(());
    }
    let tx = tx.clone();
    tokio::spawn(async move {
        let Ok(mut hup) = hup else {
            return;
        };
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading");
            let _ = tx.send(());
        }
    });
}

/// The paths the running configuration names, and those the file on disk names if it parses
/// (it may have been refused, or wait in part for a restart).
fn to_watch(shared: &Shared) -> ToWatch {
    let path = shared.config_path.as_ref();
    let (mut dirs, mut names) = watched(&shared.state.load().config, path);
    if let Some(on_disk) = path.and_then(|p| read_config(p).ok()) {
        let (more_dirs, more_names) = watched(&on_disk, path);
        dirs.extend(more_dirs);
        names.extend(more_names);
    }
    // A directory not there yet is watched through its nearest existing ancestor, for the
    // name of the part missing: its creation is a change too.
    let dirs = dirs
        .into_iter()
        .map(|d| match missing_below_existing(&d) {
            Some((ancestor, missing)) => {
                names.push(missing);
                ancestor
            }
            None => d,
        })
        .collect::<std::collections::BTreeSet<_>>();
    names.sort();
    names.dedup();
    (dirs.into_iter().collect(), names)
}

/// For a directory that does not exist: its nearest existing ancestor and the name of that
/// ancestor's missing child on the way to it.
fn missing_below_existing(dir: &std::path::Path) -> Option<(PathBuf, std::ffi::OsString)> {
    let mut missing = dir;
    loop {
        let parent = missing.parent()?;
        if missing.exists() {
            return None;
        }
        let parent = if parent.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            parent
        };
        if parent.exists() {
            return Some((parent.to_path_buf(), missing.file_name()?.to_os_string()));
        }
        missing = parent;
    }
}

fn make_watcher((dirs, names): ToWatch, tx: mpsc::UnboundedSender<()>) -> Watching {
    let wanted_names = names.clone();
    let mut watcher = match notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev {
            if relevant(&ev, &names) {
                let _ = tx.send(());
            }
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch files; only SIGHUP reloads");
            return ((dirs, wanted_names), None);
        }
    };
    let watched_dirs = dirs
        .into_iter()
        .filter(|d| match watcher.watch(d, RecursiveMode::NonRecursive) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dir = %d.display(), error = %e, "cannot watch directory");
                false
            }
        })
        .collect();
    ((watched_dirs, wanted_names), Some(watcher))
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, ModifyKind};

    fn event(kind: notify::EventKind, path: &str) -> notify::Event {
        notify::Event::new(kind).add_path(PathBuf::from(path))
    }

    #[test]
    fn only_our_files_and_kubernetes_symlink_swaps_reload() {
        let names = vec![
            std::ffi::OsString::from("tls.crt"),
            std::ffi::OsString::from("proxy.yaml"),
        ];
        let modify = notify::EventKind::Modify(ModifyKind::Any);
        assert!(relevant(&event(modify, "/etc/tls/tls.crt"), &names));
        assert!(relevant(
            &event(notify::EventKind::Create(CreateKind::Any), "/etc/tls/..data"),
            &names
        ));
        assert!(!relevant(&event(modify, "/etc/tls/access.log"), &names));
        assert!(!relevant(
            &event(
                notify::EventKind::Access(notify::event::AccessKind::Any),
                "/etc/tls/tls.crt"
            ),
            &names
        ));
    }
}

#[cfg(test)]
mod restart_tests {
    use super::{keep_running_shape, needs_restart};

    fn config(extra: &str) -> proxyfleet_config::ProxyConfig {
        let yaml = format!(
            "listeners:\n  - {{name: http, address: \"127.0.0.1:8080\"{extra}}}\nroutes: [{{name: all, upstream: u}}]\nupstreams: [{{name: u, endpoints: [\"127.0.0.1:1\"]}}]\n"
        );
        serde_yaml::from_str(&yaml).expect("config")
    }

    #[test]
    fn changes_a_running_proxy_cannot_take_are_named() {
        let base = config("");
        assert_eq!(needs_restart(&base, &base), None);
        let mut routes = base.clone();
        routes.routes[0].name = "other".into();
        assert_eq!(needs_restart(&base, &routes), None, "routes reload in place");
        let mut renamed = base.clone();
        renamed.listeners[0].name = "web".into();
        assert!(needs_restart(&base, &renamed).is_some_and(|w| w.starts_with("listeners")));
        let logged = config(", accessLog: {}");
        assert!(needs_restart(&base, &logged).is_some_and(|w| w.starts_with("listeners")));
        let mut limited = base.clone();
        limited.limits.max_connections += 1;
        assert!(needs_restart(&base, &limited).is_some_and(|w| w.starts_with("limits")));
        let mut workers = base.clone();
        workers.worker_threads = Some(3);
        assert!(needs_restart(&base, &workers).is_some_and(|w| w.starts_with("workerThreads")));
    }

    #[test]
    fn what_waits_for_a_restart_keeps_its_running_value_and_the_rest_is_taken() {
        let base = config("");
        let mut wanted = config(", accessLog: {}");
        wanted.listeners[0].address = "127.0.0.1:9090".into();
        wanted.listeners.push(config("").listeners[0].clone());
        wanted.listeners[1].name = "added".into();
        wanted.limits.max_connections += 1;
        wanted.limits.max_request_body_bytes += 1;
        wanted.worker_threads = Some(3);
        wanted.routes[0].name = "renamed".into();
        let taken = keep_running_shape(&base, wanted.clone());
        assert_eq!(needs_restart(&base, &taken), None);
        assert_eq!(taken.listeners, base.listeners, "no listener added, renamed or moved");
        assert_eq!(taken.limits.max_connections, base.limits.max_connections);
        assert_eq!(
            taken.limits.max_request_body_bytes,
            wanted.limits.max_request_body_bytes
        );
        assert_eq!(taken.routes, wanted.routes);
        assert_eq!(taken.worker_threads, None);
    }

    #[test]
    fn reordered_listeners_need_no_restart_and_a_renamed_one_keeps_its_place() {
        let two = |a: &str, b: &str| {
            let mut c = config("");
            let mut second = c.listeners[0].clone();
            (c.listeners[0].name, second.name) = (a.into(), b.into());
            second.address = "127.0.0.1:8081".into();
            c.listeners.push(second);
            c
        };
        let base = two("a", "b");
        let mut reordered = base.clone();
        reordered.listeners.reverse();
        assert_eq!(needs_restart(&base, &reordered), None);
        let renamed = two("a", "c");
        assert!(needs_restart(&base, &renamed).is_some());
        let taken = keep_running_shape(&base, renamed);
        assert_eq!(taken.listeners, base.listeners);
    }

    #[test]
    fn a_directory_not_there_yet_is_watched_through_its_nearest_ancestor() {
        let root = std::env::temp_dir().join(format!("proxyfleet-reload-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("temp dir");
        let deep = root.join("new").join("certs");
        assert_eq!(
            super::missing_below_existing(&deep),
            Some((root.clone(), std::ffi::OsString::from("new")))
        );
        assert_eq!(super::missing_below_existing(&root), None);
        std::fs::remove_dir_all(&root).expect("clean up");
    }
}
