//! Gray releases of the applications behind a fleet (issue 17): an `AppRollout` names a team's
//! Deployment and the fleet route that serves it. The operator runs the app as
//! `<name>-stable` and `<name>-canary` Deployments built from that Deployment's pod template,
//! splits the route between them in the proxies per request, moves the weights live (no proxy
//! restart), and judges the canary from the proxies' per-backend metrics with the same pure
//! canary machine the fleet's own rollouts use.
//!
//! Reading order: `spec` (the API) → `render` (how a fleet's routes change) → `objects` (the
//! Deployments and Services) → `weights` (the live weights) → `measure` → `push` (moving them) → `reconcile`.

pub mod cli;
pub mod controller;
pub mod measure;
pub mod objects;
pub mod push;
pub mod reconcile;
pub mod render;
pub mod spec;
pub mod token;
pub mod weights;
