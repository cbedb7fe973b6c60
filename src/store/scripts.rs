//! The Lua scripts of `lua/`, one per atomic state change, compiled into the
//! binary with `include_str!`, with the KEYS/ARGV counts their headers declare.
//!
//! A unit test reads each script's header and checks it against the counts
//! here, and the store's wrappers refuse to invoke a script with other counts,
//! so header, wrapper and script cannot drift apart silently.

use redis::Script;

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
pub(crate) const PROMOTE_DUE: ScriptDef = script!("promote_due", 3, 1);
/// `claim_ready`: lease ready jobs to workers.
pub(crate) const CLAIM_READY: ScriptDef = script!("claim_ready", 6, 5, repeat 2);
/// `complete_jobs`: record 2xx attempts of one partition, four ARGV per job.
pub(crate) const COMPLETE_JOBS: ScriptDef = script!("complete_jobs", 2, 6, repeat 4);
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

/// The compiled scripts (with their SHA1s), built once per store.
pub(crate) struct Scripts {
    /// Indexed like [`ALL`].
    compiled: Vec<Script>,
}

impl Scripts {
    /// Compiles every script of [`ALL`], each after the [`PRELUDE`], for a
    /// Redis Cluster (`in_cluster`: the scripts guard against slot
    /// migrations) or a single Redis (where no slot ever moves, so the guard's
    /// extra reads are skipped), with the timing wheel's finest buckets
    /// `wheel_bucket_ms` wide.
    pub(crate) fn new(in_cluster: bool, wheel_bucket_ms: u64) -> Self {
        let prelude = Prelude::parse(PRELUDE);
        Scripts {
            compiled: ALL
                .iter()
                .map(|d| {
                    Script::new(&format!(
                        "local IN_CLUSTER = {in_cluster}\nlocal WHEEL_BUCKET = {wheel_bucket_ms}\n{}\n{}",
                        prelude.needed_by(d.source),
                        d.source
                    ))
                })
                .collect(),
        }
    }

    /// The compiled form of `def`; an error naming it when it is not one
    /// of [`ALL`] (a script added without being listed there).
    pub(crate) fn get(&self, def: &ScriptDef) -> StoreResult<&Script> {
        ALL.iter()
            .position(|d| d.name == def.name)
            .and_then(|index| self.compiled.get(index))
            .ok_or_else(|| {
                StoreError::reply(
                    "script wrapper",
                    format!("{} is not listed in scripts::ALL", def.name),
                )
            })
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
