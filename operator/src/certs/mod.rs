//! Certificates: the managed CA, leaf issuance and renewal, cert-manager and existing Secrets.

pub mod acme;
pub mod acme_http;
pub mod acme_order;
pub mod acme_orders;
pub mod acme_plan;
pub mod acme_push;
pub mod ca;
pub mod ca_rotation;
pub mod cert_manager;
pub mod controller;
pub mod issue;
pub mod managed_fleets;
pub mod reconcile;
pub mod spec;
