//! `/admin`: for whoever holds `RAGTIME__ADMIN_KEY` (sent as
//! `Authorization: Bearer …`; see [`crate::auth::Admin`]). Without a
//! configured key the admin API is off and says so. One file per resource.

pub mod budgets;
pub mod collections;
pub mod experiments;
pub mod keys;
pub mod page;
pub mod stats;
pub mod tenants;
