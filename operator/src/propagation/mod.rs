//! Propagating ProxyDeployments to member clusters (see docs/multicluster.md).

pub mod apps;
pub mod clusters;
pub mod controller;
pub mod hub_apps;
pub mod member;
pub mod member_apps;
pub mod member_watch;
pub mod placement;
pub mod reconcile;
pub mod spec;
pub mod state;
pub mod status;
pub mod sync;
pub mod wave_retry;
pub mod wave_tree;
pub mod waves;
#[cfg(test)]
mod waves_props;
pub mod waves_shell;
