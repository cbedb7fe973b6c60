//! The Lua scripts of `lua/`, one per atomic state change, compiled into the
//! binary with `include_str!`, with the KEYS/ARGV counts their headers declare.
//!
//! They run in one of two forms. On Redis 7.0 and later, as one Redis
//! Functions library ([`Library`]): the prelude once, each script a function
//! (`FCALL`), loaded once per Redis (or per master of a cluster), so a call
//! no longer re-creates the prelude's definitions. On older Redis, each
//! script compiled after the part of the prelude it uses and run by
//! `EVALSHA` ([`Scripts`] keeps both; [`Runner`] says which one is used).
//!
//! A unit test reads each script's header and checks it against the counts
//! here, and the store's wrappers refuse to invoke a script with other counts,
//! so header, wrapper and script cannot drift apart silently.

use std::sync::atomic::{AtomicU8, Ordering};

use redis::Script;
use sha1::{Digest, Sha1};

use super::{StoreError, StoreResult};

/// The outcome codes of the scripts that change one job or host, the same
/// in every script (`lua/prelude.lua` names them in capitals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// The change was made.
    Done,
    /// (`fail_job`) the job's last attempt failed: it is dead.
    DeadLettered,
    /// Nothing to do: already so, identical, or stale.
    Unchanged,
    /// No such job (or dead letter).
    NotFound,
    /// The job's state does not allow it.
    WrongState,
    /// The job differs from what the caller expected.
    Changed,
    /// Only a finished job's summary remains.
    Summarized,
    /// The id's job lives in another partition (a placement pointer).
    Elsewhere,
    /// (`enqueue_jobs`) the id is one of an existing schedule's fire ids.
    Reserved,
    /// (`cancel_job`) done, but a worker had the job already: its attempt
    /// under way may still be sent.
    InFlight,
}

impl Code {
    /// Every code with its number.
    const ALL: [(Code, i64); 10] = [
        (Code::Done, 1),
        (Code::DeadLettered, 2),
        (Code::Unchanged, 0),
        (Code::NotFound, -1),
        (Code::WrongState, -2),
        (Code::Changed, -3),
        (Code::Summarized, -4),
        (Code::Elsewhere, -5),
        (Code::Reserved, -6),
        (Code::InFlight, 3),
    ];

    /// The code numbered `n`, if the prelude has one.
    pub(super) fn from_number(n: i64) -> Option<Code> {
        Code::ALL
            .iter()
            .find(|(_, v)| *v == n)
            .map(|(code, _)| *code)
    }
}

/// One script and the shape of its inputs.
pub(crate) struct ScriptDef {
    /// File name in `lua/` without the extension.
    pub name: &'static str,
    /// The Lua source.
    pub source: &'static str,
    /// Number of KEYS the script takes.
    pub keys: usize,
    /// Number of fixed ARGV the script takes.
    pub args: usize,
    /// Size of the group of ARGV that follows the fixed ones and repeats once
    /// per item (0: none). Batch scripts take one group per job.
    pub repeat: usize,
}

macro_rules! script {
    ($name:literal, $keys:expr, $args:expr) => {
        ScriptDef {
            name: $name,
            source: include_str!(concat!("../../lua/", $name, ".lua")),
            keys: $keys,
            args: $args,
            repeat: 0,
        }
    };
    ($name:literal, $keys:expr, $args:expr, repeat $repeat:expr) => {
        ScriptDef {
            name: $name,
            source: include_str!(concat!("../../lua/", $name, ".lua")),
            keys: $keys,
            args: $args,
            repeat: $repeat,
        }
    };
}

/// `enqueue_jobs`: create jobs of one partition (each idempotent by id),
/// ten ARGV per job.
pub(crate) const ENQUEUE_JOBS: ScriptDef = script!("enqueue_jobs", 3, 3, repeat 10);
/// `place_jobs`: point ids at the partition their jobs live in, three ARGV
/// per job.
pub(crate) const PLACE_JOBS: ScriptDef = script!("place_jobs", 1, 3, repeat 3);
/// `unplace_jobs`: drop the pointers of jobs gone, three ARGV per pointer.
pub(crate) const UNPLACE_JOBS: ScriptDef = script!("unplace_jobs", 1, 2, repeat 3);
/// `fleet_beat`: a daemon's heartbeat; answers the live daemons.
pub(crate) const FLEET_BEAT: ScriptDef = script!("fleet_beat", 1, 2);
/// `put_schedule`: create or change a schedule.
pub(crate) const PUT_SCHEDULE: ScriptDef = script!("put_schedule", 2, 16);
/// `place_schedule`: a stub naming the partition a schedule lives in.
pub(crate) const PLACE_SCHEDULE: ScriptDef = script!("place_schedule", 1, 3);
/// `drop_schedule`: delete a schedule.
pub(crate) const DROP_SCHEDULE: ScriptDef = script!("drop_schedule", 3, 1);
/// `fire_schedules`: fire due schedules of one partition, six ARGV per
/// schedule.
pub(crate) const FIRE_SCHEDULES: ScriptDef = script!("fire_schedules", 4, 3, repeat 6);
/// `promote_due`: move due jobs to the ready list.
pub(crate) const PROMOTE_DUE: ScriptDef = script!("promote_due", 3, 2);
/// `claim_ready`: lease ready jobs to workers.
pub(crate) const CLAIM_READY: ScriptDef = script!("claim_ready", 6, 6, repeat 2);
/// `complete_jobs`: record 2xx attempts of one partition, six ARGV per job.
pub(crate) const COMPLETE_JOBS: ScriptDef = script!("complete_jobs", 2, 6, repeat 6);
/// `fail_job`: record a failure (next rung or dead letter).
pub(crate) const FAIL_JOB: ScriptDef = script!("fail_job", 8, 11);
/// `reclaim_expired`: take back attempts whose lease expired.
pub(crate) const RECLAIM_EXPIRED: ScriptDef = script!("reclaim_expired", 5, 7);
/// `cancel_job`: cancel an unfinished job.
pub(crate) const CANCEL_JOB: ScriptDef = script!("cancel_job", 4, 7);
/// `reschedule_job`: change a scheduled job.
pub(crate) const RESCHEDULE_JOB: ScriptDef = script!("reschedule_job", 4, 10);

/// `replay_dead`: revive a dead letter.
pub(crate) const REPLAY_DEAD: ScriptDef = script!("replay_dead", 5, 7);
/// `drop_dead`: delete a dead letter and its index pointer.
pub(crate) const DROP_DEAD: ScriptDef = script!("drop_dead", 2, 2);
/// `index_dead`: index dead letters made before the index, two ARGV per
/// entry.
pub(crate) const INDEX_DEAD: ScriptDef = script!("index_dead", 2, 1, repeat 2);

/// `defer_jobs`: give claimed jobs of one partition back unattempted, three
/// ARGV per job.
pub(crate) const DEFER_JOBS: ScriptDef = script!("defer_jobs", 3, 3, repeat 3);

/// `seed_ledger`: count the jobs live before the ledger, once per partition.
pub(crate) const SEED_LEDGER: ScriptDef = script!("seed_ledger", 2, 1);

/// `take_rate`: take tokens of a host's shared per-window request budget.
pub(crate) const TAKE_RATE: ScriptDef = script!("take_rate", 1, 3);

/// `park_jobs`: hold claimed jobs of one partition for their blocked host,
/// two ARGV per job.
pub(crate) const PARK_JOBS: ScriptDef = script!("park_jobs", 4, 2, repeat 2);
/// `unpark_jobs`: drain a host's parking in one partition.
pub(crate) const UNPARK_JOBS: ScriptDef = script!("unpark_jobs", 4, 5);
/// `host_failure`: count a failed attempt against its host (breaker).
pub(crate) const HOST_FAILURE: ScriptDef = script!("host_failure", 3, 7);
/// `host_success`: end a host's run of failures; close it after a probe.
pub(crate) const HOST_SUCCESS: ScriptDef = script!("host_success", 3, 3);
/// `host_probe`: begin or take the half-open probe.
pub(crate) const HOST_PROBE: ScriptDef = script!("host_probe", 2, 4);
/// `host_pause`: pause a host (operator, Retry-After).
pub(crate) const HOST_PAUSE: ScriptDef = script!("host_pause", 3, 4);
/// `host_resume`: close a paused or open host.
pub(crate) const HOST_RESUME: ScriptDef = script!("host_resume", 3, 3);
/// `host_drain`: turns at draining a closed host's parked jobs.
pub(crate) const HOST_DRAIN: ScriptDef = script!("host_drain", 2, 3);

/// `migrate_jobs`: convert job records of one partition from layout 1 to
/// layout 3, one ARGV per job.
pub(crate) const MIGRATE_JOBS: ScriptDef = script!("migrate_jobs", 1, 2, repeat 1);
/// `migrate_records`: convert job records of one partition from layout 2 to
/// layout 3, one ARGV per job.
pub(crate) const MIGRATE_RECORDS: ScriptDef = script!("migrate_records", 1, 1, repeat 1);
/// `merge_timers`: move a batch of one partition's due sets and wheel into
/// the shared timers of a single Redis (layout 5).
pub(crate) const MERGE_TIMERS: ScriptDef = script!("merge_timers", 4, 1);

/// Every script, for loading at start-up and for the header check.
pub(crate) const ALL: &[&ScriptDef] = &[
    &FLEET_BEAT,
    &ENQUEUE_JOBS,
    &PLACE_JOBS,
    &UNPLACE_JOBS,
    &PUT_SCHEDULE,
    &PLACE_SCHEDULE,
    &DROP_SCHEDULE,
    &FIRE_SCHEDULES,
    &PROMOTE_DUE,
    &CLAIM_READY,
    &COMPLETE_JOBS,
    &FAIL_JOB,
    &RECLAIM_EXPIRED,
    &CANCEL_JOB,
    &RESCHEDULE_JOB,
    &REPLAY_DEAD,
    &DROP_DEAD,
    &INDEX_DEAD,
    &SEED_LEDGER,
    &DEFER_JOBS,
    &TAKE_RATE,
    &PARK_JOBS,
    &UNPARK_JOBS,
    &HOST_FAILURE,
    &HOST_SUCCESS,
    &HOST_PROBE,
    &HOST_PAUSE,
    &HOST_RESUME,
    &HOST_DRAIN,
    &MIGRATE_JOBS,
    &MIGRATE_RECORDS,
    &MERGE_TIMERS,
];

/// Shared Lua helpers prepended to every script (`slot_moving`, `try_again`:
/// how a script gives up unchanged during a cluster slot migration).
pub(crate) const PRELUDE: &str = include_str!("../../lua/prelude.lua");

/// The prelude cut into its top-level definitions (`local function f`,
/// `local NAME = ...`), so that a script is compiled with only those it uses,
/// directly or through another: Redis runs a script's whole text on every
/// call, and defining the prelude's ~90 functions cost ~6 µs a call warm,
/// ~33 µs when the call wakes an idle Redis.
struct Prelude<'a> {
    /// Each definition: its text (with the comments that follow it), the
    /// names it defines, and the indexes of the definitions it uses.
    chunks: Vec<(&'a str, Vec<&'a str>, Vec<usize>)>,
}

impl<'a> Prelude<'a> {
    fn parse(text: &'a str) -> Prelude<'a> {
        let mut starts: Vec<usize> = Vec::new();
        let mut offset = 0;
        for line in text.split_inclusive('\n') {
            if line.starts_with("local ") {
                starts.push(offset);
            }
            offset += line.len();
        }
        let mut chunks: Vec<(&str, Vec<&str>, Vec<usize>)> = starts
            .iter()
            .enumerate()
            .map(|(i, &start)| {
                let end = starts.get(i + 1).copied().unwrap_or(text.len());
                let chunk = &text[start..end];
                (chunk, defined_names(chunk), Vec::new())
            })
            .collect();
        for i in 0..chunks.len() {
            let used = identifiers(chunks[i].0);
            let deps: Vec<usize> = (0..chunks.len())
                .filter(|&j| j != i && chunks[j].1.iter().any(|n| used.contains(n)))
                .collect();
            chunks[i].2 = deps;
        }
        Prelude { chunks }
    }

    /// The definitions `source` uses, with theirs, in the prelude's order.
    fn needed_by(&self, source: &str) -> String {
        let used = identifiers(source);
        let mut needed = vec![false; self.chunks.len()];
        let mut stack: Vec<usize> = (0..self.chunks.len())
            .filter(|&i| self.chunks[i].1.iter().any(|n| used.contains(n)))
            .collect();
        while let Some(i) = stack.pop() {
            if !needed[i] {
                needed[i] = true;
                stack.extend(self.chunks[i].2.iter().copied());
            }
        }
        self.chunks
            .iter()
            .zip(needed)
            .filter(|(_, n)| *n)
            .map(|(c, _)| c.0)
            .collect()
    }
}

/// The names a top-level `local` statement defines.
fn defined_names(chunk: &str) -> Vec<&str> {
    let first = chunk.lines().next().unwrap_or("");
    let rest = first.trim_start_matches("local ").trim_start();
    if let Some(f) = rest.strip_prefix("function ") {
        return f.split('(').next().map(str::trim).into_iter().collect();
    }
    rest.split('=')
        .next()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect()
}

/// The identifiers in Lua `code`, comments left out.
fn identifiers(code: &str) -> std::collections::HashSet<&str> {
    let mut out = std::collections::HashSet::new();
    let mut in_block = false;
    for line in code.lines() {
        let mut text = line;
        if in_block {
            match text.find("]]") {
                Some(i) => {
                    in_block = false;
                    text = &text[i + 2..];
                }
                None => continue,
            }
        }
        if let Some(i) = text.find("--") {
            in_block = text[i..].starts_with("--[[") && !text[i..].contains("]]");
            text = &text[..i];
        }
        out.extend(
            text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')),
        );
    }
    out
}

/// The prelude's per-call state: each top-level `local NAME = value` that a
/// prelude function assigns again (`moving_checked`, asked once per call),
/// as Lua statements setting it back to its first value. A function of the
/// library runs them first: the prelude's locals live as long as the
/// library, where a script run by `EVALSHA` got fresh ones on every call.
fn per_call_state(prelude: &str) -> String {
    let mut resets = String::new();
    for line in prelude.lines() {
        let Some(rest) = line.strip_prefix("local ") else {
            continue;
        };
        let Some((name, value)) = rest.split_once('=') else {
            continue;
        };
        let name = name.trim();
        if rest.starts_with("function ") || name.contains(',') {
            continue;
        }
        let assigned_again = prelude.lines().any(|l| {
            l.starts_with(char::is_whitespace)
                && l.trim_start().strip_prefix(name).is_some_and(|r| {
                    let r = r.trim_start();
                    r.starts_with('=') && !r.starts_with("==")
                })
        });
        if assigned_again {
            let value = value.split("--").next().unwrap_or("").trim();
            resets.push_str(&format!("{name} = {value}\n"));
        }
    }
    resets
}

/// The globals the library's functions use, declared as locals of the
/// library ([`globals_as_locals`]): a global is a lookup in the globals
/// table on every use, a local of the library an upvalue.
const LIBRARY_GLOBALS: &str =
    "string, table, math, struct, cjson, bit, tonumber, tostring, unpack, type, pcall, ipairs";

/// [`LIBRARY_GLOBALS`] declared as locals of the library, and the statement
/// that binds them. Redis runs a library's top level without them, so
/// every function runs that statement first (once bound, they stay bound
/// for the library's life).
fn globals_as_locals() -> (String, String) {
    let declare = format!(
        "local function runtime_globals()\n  return {LIBRARY_GLOBALS}\nend\nlocal {LIBRARY_GLOBALS}\n"
    );
    let bind = format!("if not string then\n  {LIBRARY_GLOBALS} = runtime_globals()\nend\n");
    (declare, bind)
}

/// `ipairs` in plain Lua, for the prelude's top-level statements: Redis
/// runs a library's top level (at `FUNCTION LOAD`) without Lua's base
/// functions, which its functions have when they run.
const LOAD_TIME_IPAIRS: &str = "local function load_time_ipairs(t)
  local i = 0
  return function()
    i = i + 1
    if t[i] ~= nil then return i, t[i] end
  end
end
";

/// `prelude` with each top-level loop (a line starting `for `, the only
/// top-level statements besides definitions) run in a block where `ipairs`
/// is [`LOAD_TIME_IPAIRS`]; the prelude's functions keep Lua's own.
fn at_load_time(prelude: &str) -> String {
    prelude
        .split_inclusive('\n')
        .map(|line| {
            if line.starts_with("for ") {
                format!(
                    "do local ipairs = load_time_ipairs; {} end\n",
                    line.trim_end()
                )
            } else {
                line.to_string()
            }
        })
        .collect()
}

/// The scripts that add jobs or schedules (or grow one): as functions they
/// are refused at Redis's `maxmemory`, the others run there (see
/// [`Library::new`]).
const GROWING: [&ScriptDef; 7] = [
    &ENQUEUE_JOBS,
    &PLACE_JOBS,
    &PUT_SCHEDULE,
    &PLACE_SCHEDULE,
    &FIRE_SCHEDULES,
    &RESCHEDULE_JOB,
    &REPLAY_DEAD,
];

/// The scripts whose calls may go to Redis together, several in one
/// `FCALL` of the batch function ([`BATCH`]): the claim loops' and the
/// outcome recording's, which a steady load makes at the same moments.
/// None of them adds jobs (the batch runs at `maxmemory`).
pub(crate) const BATCHED: [&ScriptDef; 3] = [&PROMOTE_DUE, &CLAIM_READY, &COMPLETE_JOBS];

/// `lua/batch.lua`: the batch function's Lua (`run_batch`).
const BATCH: &str = include_str!("../../lua/batch.lua");

/// The constants defined above the prelude, from the store's config:
/// `IN_CLUSTER` (the scripts guard against slot migrations; on a single
/// Redis the timers are shared) and `WHEEL_BUCKET` (the timing wheel's
/// finest width, ms).
fn constants(in_cluster: bool, wheel_bucket_ms: u64) -> String {
    format!("local IN_CLUSTER = {in_cluster}\nlocal WHEEL_BUCKET = {wheel_bucket_ms}\n")
}

/// What every hookq library's name starts with (then [`LIBRARY_DIGEST_HEX`]
/// hex digits of its digest): [`Library::name`].
pub(crate) const LIBRARY_PREFIX: &str = "hookq_";
/// How many hex digits of its source's SHA1 a library's name carries.
pub(crate) const LIBRARY_DIGEST_HEX: usize = 16;

/// The Lua library as Redis Functions: the [`constants`], the whole prelude once, then every script of [`ALL`]
/// registered as a function whose callback is the script's text (its
/// `KEYS` and `ARGV` are the callback's arguments).
pub(crate) struct Library {
    /// [`LIBRARY_PREFIX`] and [`LIBRARY_DIGEST_HEX`] hex digits of the SHA1 of the library's whole source
    /// (prelude, scripts, `IN_CLUSTER`, `WHEEL_BUCKET`): daemons of another
    /// version or config on the same Redis load a library of another name,
    /// so none replaces another's functions.
    pub(crate) name: String,
    /// The source `FUNCTION LOAD` takes (`#!lua name=<name>` first).
    pub(crate) code: String,
    /// The function of each script, `<name>_<script>`, indexed like [`ALL`].
    functions: Vec<String>,
    /// The batch function (`lua/batch.lua`), `<name>_batch`.
    pub(crate) batch: String,
}

impl Library {
    /// Builds the library for a cluster or a single Redis (as
    /// [`Scripts::new`]).
    fn new(in_cluster: bool, wheel_bucket_ms: u64) -> Library {
        const NAME: &str = "@LIBRARY@";
        let (declare_globals, bind_globals) = globals_as_locals();
        // What every function runs first.
        let prologue = format!("{bind_globals}{}", per_call_state(PRELUDE));
        let mut body = format!(
            "{}{LOAD_TIME_IPAIRS}{declare_globals}{}\n",
            constants(in_cluster, wheel_bucket_ms),
            at_load_time(PRELUDE)
        );
        for def in ALL {
            // Eval-compatible: a script run by EVAL without flags may touch
            // keys of several slots of its node; so may these functions.
            // And a function runs at Redis's `maxmemory` only with
            // `allow-oom` (EVAL refused a script there only at its first
            // write of a command that may grow memory): every script but
            // those that add jobs or schedules, so that at the wall creates
            // are refused while deliveries, which free memory, go on.
            let flags = if GROWING.iter().any(|g| g.name == def.name) {
                "'allow-cross-slot-keys'"
            } else {
                "'allow-cross-slot-keys', 'allow-oom'"
            };
            let callback = format!("function(KEYS, ARGV)\n{prologue}{}\nend", def.source);
            let callback = if BATCHED.iter().any(|b| b.name == def.name) {
                // Named, for the batch function too.
                body.push_str(&format!("local batched_{} = {callback}\n", def.name));
                format!("batched_{}", def.name)
            } else {
                callback
            };
            body.push_str(&format!(
                "redis.register_function{{function_name = '{NAME}_{}', \
                 flags = {{{flags}}}, callback = {callback}}}\n",
                def.name
            ));
        }
        // The batch function: several calls of those in one FCALL.
        let batched: Vec<String> = BATCHED
            .iter()
            .map(|b| format!("{0} = batched_{0}", b.name))
            .collect();
        body.push_str(&format!(
            "local BATCHED = {{{}}}\n{BATCH}\n\
             redis.register_function{{function_name = '{NAME}_batch', \
             flags = {{'allow-cross-slot-keys', 'allow-oom'}}, \
             callback = function(KEYS, ARGV)\n{bind_globals}return run_batch(KEYS, ARGV)\nend}}\n",
            batched.join(", ")
        ));
        let digest: String = Sha1::digest(body.as_bytes())
            .iter()
            .take(LIBRARY_DIGEST_HEX / 2)
            .map(|b| format!("{b:02x}"))
            .collect();
        let name = format!("{LIBRARY_PREFIX}{digest}");
        Library {
            code: format!("#!lua name={name}\n{}", body.replace(NAME, &name)),
            functions: ALL.iter().map(|d| format!("{name}_{}", d.name)).collect(),
            batch: format!("{name}_batch"),
            name,
        }
    }
}

/// How the scripts run on this store's Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runner {
    /// Not known yet: `FCALL` is tried first.
    Unknown = 0,
    /// As the [`Library`]'s functions, by `FCALL` (Redis ≥ 7.0).
    Functions = 1,
    /// Each compiled script by `EVALSHA` (Redis without Functions).
    Evalsha = 2,
}

/// The scripts of a store, built once per store: the [`Library`] and each
/// script compiled for `EVALSHA` (with its SHA1), and which of the two runs.
pub(crate) struct Scripts {
    /// Indexed like [`ALL`].
    compiled: Vec<Script>,
    library: Library,
    /// A [`Runner`], shared by the store's clones.
    runner: AtomicU8,
}

impl Scripts {
    /// Compiles every script of [`ALL`] for a Redis Cluster (`in_cluster`:
    /// the scripts guard against slot migrations) or a single Redis (where
    /// no slot ever moves, so the guard's extra reads are skipped), with the
    /// timing wheel's finest buckets `wheel_bucket_ms` wide: the
    /// [`Library`], and each script after the [`PRELUDE`] definitions it
    /// uses for `EVALSHA`.
    pub(crate) fn new(in_cluster: bool, wheel_bucket_ms: u64) -> Self {
        let prelude = Prelude::parse(PRELUDE);
        let constants = constants(in_cluster, wheel_bucket_ms);
        Scripts {
            compiled: ALL
                .iter()
                .map(|d| {
                    Script::new(&format!(
                        "{constants}{}\n{}",
                        prelude.needed_by(d.source),
                        d.source
                    ))
                })
                .collect(),
            library: Library::new(in_cluster, wheel_bucket_ms),
            runner: AtomicU8::new(Runner::Unknown as u8),
        }
    }

    /// The position of `def` in [`ALL`]; an error naming it when it is not
    /// there (a script added without being listed).
    fn index(def: &ScriptDef) -> StoreResult<usize> {
        ALL.iter().position(|d| d.name == def.name).ok_or_else(|| {
            StoreError::reply(
                "script wrapper",
                format!("{} is not listed in scripts::ALL", def.name),
            )
        })
    }

    /// The compiled form of `def` (for `EVALSHA`); an error naming it when
    /// it is not one of [`ALL`].
    pub(crate) fn get(&self, def: &ScriptDef) -> StoreResult<&Script> {
        let index = Scripts::index(def)?;
        self.compiled.get(index).ok_or_else(|| {
            StoreError::reply("script wrapper", format!("{} is not compiled", def.name))
        })
    }

    /// The library's function for `def` (for `FCALL`).
    pub(crate) fn function(&self, def: &ScriptDef) -> StoreResult<&str> {
        let index = Scripts::index(def)?;
        self.library
            .functions
            .get(index)
            .map(String::as_str)
            .ok_or_else(|| {
                StoreError::reply("script wrapper", format!("{} is not registered", def.name))
            })
    }

    /// The Lua library.
    pub(crate) fn library(&self) -> &Library {
        &self.library
    }

    /// How the scripts run now.
    pub(crate) fn runner(&self) -> Runner {
        match self.runner.load(Ordering::Acquire) {
            1 => Runner::Functions,
            2 => Runner::Evalsha,
            _ => Runner::Unknown,
        }
    }

    /// Sets how the scripts run; whether that changed it.
    pub(crate) fn set_runner(&self, runner: Runner) -> bool {
        self.runner.swap(runner as u8, Ordering::AcqRel) != runner as u8
    }

    /// All compiled scripts with their definitions.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static ScriptDef, &Script)> {
        ALL.iter().copied().zip(self.compiled.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    /// A script missing from [`ALL`] is an error naming it, never another
    /// script run in its place.
    #[test]
    fn a_script_not_listed_is_refused_by_name() {
        let scripts = Scripts::new(false, 65_536);
        assert!(scripts.get(&ENQUEUE_JOBS).is_ok());
        let stray = ScriptDef {
            name: "not_listed",
            source: "return 1",
            keys: 0,
            args: 0,
            repeat: 0,
        };
        let err = scripts.get(&stray).expect_err("not listed");
        assert!(err.to_string().contains("not_listed"), "{err}");
    }

    /// The library registers every script under a name carrying the digest
    /// of the whole source, which differs with the compiled-in config; each
    /// callback starts by resetting the prelude's per-call state
    /// (`moving_checked`, else a slot migration would be checked once per
    /// library instead of once per call).
    #[test]
    fn the_library_names_its_digest_and_resets_per_call_state() {
        let resets = per_call_state(PRELUDE);
        assert_eq!(resets, "moving_checked = false\n");
        let (_, bind_globals) = globals_as_locals();
        let prologue = format!("{bind_globals}{resets}");
        let library = Library::new(false, 65_536);
        assert!(library
            .code
            .starts_with(&format!("#!lua name={}\n", library.name)));
        assert_eq!(library.name.len(), "hookq_".len() + 16);
        for def in ALL {
            let register = format!("function_name = '{}_{}'", library.name, def.name);
            let at = library.code.find(&register).expect(def.name);
            let callback = &library.code[at..];
            let body = &callback[callback.find("function(KEYS, ARGV)\n").expect("callback")..];
            assert!(
                body["function(KEYS, ARGV)\n".len()..].starts_with(&prologue),
                "{} does not bind the globals and reset the per-call state first",
                def.name
            );
        }
        let batch = format!("function_name = '{}', ", library.batch);
        let at = library.code.find(&batch).expect("the batch function");
        assert!(library.code[at..].contains(&format!(
            "function(KEYS, ARGV)\n{bind_globals}return run_batch"
        )));
        let scripts = Scripts::new(false, 65_536);
        assert_eq!(
            scripts.function(&CLAIM_READY).ok(),
            Some(format!("{}_claim_ready", library.name).as_str())
        );
        for other in [Library::new(true, 65_536), Library::new(false, 1_024)] {
            assert_ne!(other.name, library.name);
        }
        assert_eq!(Library::new(false, 65_536).name, library.name);
    }

    /// Highest `NAME[n]` index mentioned in the script's `--[[ ... ]]` header.
    fn declared(source: &str, name: &str) -> usize {
        let header = source
            .split("]]")
            .next()
            .expect("every script opens with a --[[ ]] header");
        let needle = format!("{name}[");
        header
            .match_indices(&needle)
            .filter_map(|(i, _)| {
                let rest = &header[i + needle.len()..];
                rest.split(']').next()?.parse::<usize>().ok()
            })
            .max()
            .unwrap_or(0)
    }

    /// The prelude's names of the outcome codes have the numbers `Code`
    /// decodes, and no script answers a bare number where a name exists.
    #[test]
    fn outcome_codes_match_the_prelude() {
        let prelude = include_str!("../../lua/prelude.lua");
        for (code, n) in Code::ALL {
            let name = match code {
                Code::Done => "DONE",
                Code::DeadLettered => "DEAD_LETTERED",
                Code::Unchanged => "UNCHANGED",
                Code::NotFound => "NOT_FOUND",
                Code::WrongState => "WRONG_STATE",
                Code::Changed => "CHANGED",
                Code::Summarized => "SUMMARIZED",
                Code::Elsewhere => "ELSEWHERE",
                Code::Reserved => "RESERVED",
                Code::InFlight => "IN_FLIGHT",
            };
            let line = format!("local {name} = {n} ");
            assert!(prelude.contains(&line), "the prelude lacks `{line}`");
            assert_eq!(
                redis::from_redis_value::<Code>(&Value::Int(n)).ok(),
                Some(code)
            );
        }
        assert!(redis::from_redis_value::<Code>(&Value::Int(7)).is_err());
        assert!(redis::from_redis_value::<Code>(&Value::Nil).is_err());
        for def in ALL {
            for bare in [
                "return -1",
                "return {-1",
                "return {0}",
                "return -2",
                "return -3",
            ] {
                assert!(
                    !def.source.contains(bare),
                    "{} answers `{bare}` instead of a named code",
                    def.name
                );
            }
        }
    }

    /// The prelude's bound on how early a claim takes a job (a scheduled job
    /// due later cannot be in a round lease) is the config's.
    #[test]
    fn the_prelude_knows_the_longest_claim_ahead() {
        let declared = format!(
            "local MAX_CLAIM_AHEAD_MS = {}\n",
            crate::config::MAX_CLAIM_AHEAD.as_millis()
        );
        assert!(
            PRELUDE.contains(&declared),
            "the prelude lacks `{declared}`"
        );
    }

    /// A script gets the prelude definitions it calls and theirs, not the
    /// others (what `promote_due` uses is in; the summaries are not).
    #[test]
    fn scripts_get_only_the_prelude_they_use() {
        let prelude = Prelude::parse(PRELUDE);
        let promote = prelude.needed_by(PROMOTE_DUE.source);
        for used in [
            "local function promote_due_jobs(",
            "local function wheel_slot(",
            "local function live(",
            "local function job_shard(",
            "local function now_ms(",
            "local function try_again(",
        ] {
            assert!(promote.contains(used), "promote_due lacks `{used}`");
        }
        assert!(!promote.contains("local function summaries_write("));
        assert!(
            promote.len() < PRELUDE.len() / 2,
            "promote_due gets most of the prelude"
        );
        let beat = prelude.needed_by(FLEET_BEAT.source);
        assert!(beat.contains("local function now_ms("));
        assert!(!beat.contains("local function rec_get("));
    }

    #[test]
    fn headers_match_wrappers() {
        for def in ALL {
            assert!(def.source.starts_with("--[["), "{} has no header", def.name);
            assert_eq!(declared(def.source, "KEYS"), def.keys, "{} KEYS", def.name);
            // A repeating group is declared by its first occurrence.
            assert_eq!(
                declared(def.source, "ARGV"),
                def.args + def.repeat,
                "{} ARGV",
                def.name
            );
            assert!(
                def.source.contains("Output:"),
                "{} header names no output",
                def.name
            );
        }
    }

    #[test]
    fn scripts_touch_only_declared_inputs() {
        for def in ALL {
            let body = def
                .source
                .split("]]")
                .skip(1)
                .collect::<Vec<_>>()
                .join("]]");
            assert!(
                declared(&body, "KEYS") <= def.keys,
                "{} uses an undeclared KEYS",
                def.name
            );
            assert!(
                declared(&body, "ARGV") <= def.args,
                "{} uses an undeclared ARGV",
                def.name
            );
            for banned in ["KEYS *", "'KEYS'", "SCAN", "LREM", "SMEMBERS"] {
                assert!(!body.contains(banned), "{} uses {banned}", def.name);
            }
        }
    }
}
