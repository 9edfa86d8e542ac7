//! Propagating ProxyDeployments to member clusters (see docs/multicluster.md).

pub mod clusters;
pub mod controller;
pub mod member;
pub mod placement;
pub mod reconcile;
pub mod spec;
pub mod state;
pub mod status;
