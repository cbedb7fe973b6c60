//! hookq holds HTTP callback jobs in Redis and delivers each one at its due
//! time, retrying failures on a ladder and dead-lettering what exhausts it.
//!
//! The path of a job, and the module that owns each stage:
//!
//! ```text
//!  POST /v1/jobs, hookq enqueue          api, cli → job (validation)
//!        │  enqueue_jobs.lua               store
//!        ▼
//!  due zset ──(due time, Redis TIME)──▶  carrier (promote_due.lua, woken by wake)
//!        │                                  ▲
//!        ▼                                  │ fail_job.lua: next rung
//!  ready list ──(free worker permits)──▶ worker (claim_ready.lua)
//!        │                                  │
//!        ▼                                  │
//!  inflight zset (lease, fencing token) ── delivery (HTTP attempt)
//!        │        └─ lease expired ──▶ carrier (reclaim_expired.lua) → ready
//!        ▼
//!  delivered (complete_jobs.lua, batched: completions)  │  dead stream (fail_job.lua: no rung left)
//! ```
//!
//! Every state change is one Lua script (`lua/`), so several daemons can share
//! one Redis with no lock. Time comes from Redis's clock ([`clock`]).
//!
//! Items are `pub(crate)` unless the binary, the integration tests or the
//! benchmark use them. `ARCHITECTURE.md` maps the modules, keys and scripts.
#![forbid(unsafe_code)]

pub(crate) mod alerts;
pub mod api;
pub(crate) mod backoff;
pub mod carrier;
pub mod cli;
pub mod clock;
pub(crate) mod completions;
pub mod config;
pub mod daemon;
pub mod deadletter;
pub(crate) mod delivery;
pub mod doctor;
pub(crate) mod firer;
pub mod fleet;
pub(crate) mod holding;
pub(crate) mod hosts;
pub mod job;
pub mod retry;
pub mod schedule;
pub mod store;
pub(crate) mod telemetry;
pub mod tenant;
pub mod wake;
pub mod worker;
