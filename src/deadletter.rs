//! Dead letters: choosing which to replay (by job ids, or all of a topic
//! and/or since a time), reviving them with a fresh ladder (optionally at a new
//! URL) and reporting what happened. Shared by `POST /v1/dead-letters/replay`
//! and `hookq replay --dead-letters`.
//!
//! Each revival is one `replay_dead` script: the job is live again and its
//! stream entry deleted in the same atomic step, so an interrupted replay
//! loses nothing and a repeated one revives nothing twice.

use serde::Serialize;

use crate::config::Config;
use std::collections::BTreeMap;

use crate::job::{
    same_origin, validate_headers, validate_id, validate_topic, validate_url, FieldError, JobSpec,
};
use crate::store::listing::DeadLetter;
use crate::store::{ReplayOutcome, Store, StoreResult};

/// Dead letters read per page while replaying by filter.
const PAGE: usize = 500;

/// Which dead letters to replay.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// With `ids`, the tenant they belong to (None: `default`); with `all`,
    /// only this tenant's dead letters (None: every tenant's).
    pub tenant: Option<String>,
    /// These jobs' newest dead letters.
    pub ids: Vec<String>,
    /// Or every dead letter (`all`), narrowed by topic and time.
    pub all: bool,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only dead-lettered at or after this epoch ms.
    pub since_ms: Option<i64>,
}

impl Selection {
    /// Checks the selection: ids, or `all` (optionally with topic/since).
    pub(crate) fn validate(&self) -> Result<(), FieldError> {
        if self.ids.len() > 10_000 {
            return Err(FieldError::new(
                "invalid_ids",
                "ids",
                "at most 10000 ids per replay",
            ));
        }
        for (i, id) in self.ids.iter().enumerate() {
            validate_id(id).map_err(|mut e| {
                e.field = Some(format!("ids[{i}]"));
                e
            })?;
        }
        if let Some(topic) = &self.topic {
            validate_topic(topic)?;
        }
        if let Some(tenant) = &self.tenant {
            crate::job::validate_tenant(tenant, "tenant")?;
        }
        match (self.ids.is_empty(), self.all) {
            (false, true) => Err(FieldError::new(
                "conflicting_fields",
                "all",
                "give either ids or all, not both",
            )),
            (false, false) if self.topic.is_some() || self.since_ms.is_some() => {
                Err(FieldError::new(
                    "conflicting_fields",
                    "ids",
                    "topic and since narrow `all`; they do not combine with ids",
                ))
            }
            (true, false) => Err(FieldError::new(
                "missing_field",
                "all",
                "give ids, or all: true (optionally narrowed by topic and since)",
            )),
            _ => Ok(()),
        }
    }
}

/// What a replay did (or, dry, would do). Its lists name jobs by their id
/// within the replay's tenant; a replay of every tenant's dead letters
/// names a job of another tenant than `default` `<tenant>/<id>` (as its
/// `webhook-id` does).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    /// True when nothing was changed.
    pub dry_run: bool,
    /// Jobs revived (or, dry, that would be).
    pub replayed: Vec<String>,
    /// Jobs that were live already: their stale dead letters were dropped.
    pub already_live: Vec<String>,
    /// Requested ids with no dead letter.
    pub not_found: Vec<String>,
}

/// Parses `since`: RFC 3339, epoch milliseconds, or a humantime duration
/// meaning that long ago (`"2h"`).
pub(crate) fn parse_since(text: &str, field: &str) -> Result<i64, FieldError> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    if let Ok(t) = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
    {
        return Ok((t.unix_timestamp_nanos() / 1_000_000) as i64);
    }
    if let Ok(ago) = humantime::parse_duration(text) {
        return Ok(crate::job::now_ms() - ago.as_millis() as i64);
    }
    Err(FieldError::new(
        "invalid_time",
        field,
        format!(
            "{field} `{}` is not an RFC 3339 time, epoch milliseconds or a duration like 2h",
            crate::job::quote(text)
        ),
    ))
}

/// The spec a dead letter revives with: its own, or sent to `url`. Sent to
/// another origin (scheme, host or port), it leaves its headers behind: they
/// may carry the old receiver's credentials (`authorization`, an API key),
/// which must not follow a replay to an address someone else chose.
/// Headers given with the replay replace the job's, wherever it goes.
fn revived_spec(dead: &DeadLetter, change: &Revival) -> Option<JobSpec> {
    let mut spec: JobSpec = serde_json::from_str(&dead.job_json).ok()?;
    if let Some(url) = &change.url {
        if !same_origin(&spec.url, url) {
            spec.headers.clear();
        }
        spec.url = url.clone();
    }
    if let Some(headers) = &change.headers {
        spec.headers = headers.clone();
    }
    Some(spec)
}

/// What a replay changes in the jobs it revives.
#[derive(Debug, Clone, Default)]
pub struct Revival {
    /// Send them to this URL (normalised; see [`Revival::new`]).
    pub url: Option<String>,
    /// Send these headers instead of the jobs' own.
    pub headers: Option<BTreeMap<String, String>>,
}

impl Revival {
    /// Checks a replay's new `url` and `headers` (fields named as in the
    /// request; the CLI maps them to its flags).
    pub(crate) fn new(
        url: Option<&str>,
        headers: Option<BTreeMap<String, String>>,
    ) -> Result<Revival, FieldError> {
        let url = url.map(|u| validate_url(u, "url")).transpose()?;
        if let Some(headers) = &headers {
            validate_headers(headers)?;
        }
        Ok(Revival { url, headers })
    }
}

/// Dead letters looked up at once when a replay names them by id.
const LOOKUPS_AT_ONCE: usize = 32;

/// Replays the selected dead letters; `progress` is called with the running
/// count of handled entries.
pub async fn replay(
    store: &Store,
    config: &Config,
    selection: &Selection,
    change: &Revival,
    dry_run: bool,
    mut progress: impl FnMut(usize),
) -> StoreResult<ReplayReport> {
    let mut report = ReplayReport {
        dry_run,
        ..ReplayReport::default()
    };
    let mut handled = 0;
    if !selection.ids.is_empty() {
        // The lookups go out a few dozen at a time (up to 10,000 ids, each
        // a couple of reads); the revivals follow in the order given.
        use futures_util::StreamExt;
        let tenant = selection
            .tenant
            .as_deref()
            .unwrap_or(crate::tenant::DEFAULT_TENANT);
        let mut found = futures_util::stream::iter(selection.ids.iter().cloned())
            .map(|id| async move {
                let dead = store
                    .find_dead(&crate::tenant::internal_id(tenant, &id))
                    .await;
                (id, dead)
            })
            .buffered(LOOKUPS_AT_ONCE);
        while let Some((id, dead)) = found.next().await {
            match dead? {
                Some(dead) => {
                    revive(store, config, &dead, change, dry_run, true, &mut report).await?
                }
                None => report.not_found.push(id),
            }
            handled += 1;
            progress(handled);
        }
        return Ok(report);
    }
    let mut cursor = None;
    loop {
        let page = store
            .list_dead(
                selection.tenant.as_deref(),
                selection.topic.as_deref(),
                selection.since_ms,
                PAGE,
                cursor,
            )
            .await?;
        let within = selection.tenant.is_some();
        for dead in &page.items {
            revive(store, config, dead, change, dry_run, within, &mut report).await?;
            handled += 1;
            progress(handled);
        }
        match page.next_cursor {
            Some(next) => {
                cursor = Some(
                    crate::store::listing::Cursor::parse(
                        &next,
                        store.keys().partitions(),
                        crate::store::listing::CursorKind::DeadLetters,
                        "cursor",
                    )
                    .map_err(|e| crate::store::StoreError::Reply {
                        what: "dead-letter cursor",
                        detail: e.message,
                    })?,
                );
            }
            None => return Ok(report),
        }
    }
}

/// Revives `dead` into `report`, naming it by its id within its tenant
/// when the replay is `within` one tenant, else by its internal id.
async fn revive(
    store: &Store,
    config: &Config,
    dead: &DeadLetter,
    change: &Revival,
    dry_run: bool,
    within: bool,
    report: &mut ReplayReport,
) -> StoreResult<()> {
    let name = if within { &dead.job_id } else { &dead.id }.clone();
    let Some(spec) = revived_spec(dead, change) else {
        tracing::warn!(job_id = %dead.id, entry = %dead.entry_id, "dead letter has no readable job; skipped");
        report.not_found.push(name);
        return Ok(());
    };
    if dry_run {
        report.replayed.push(name);
        return Ok(());
    }
    let outcome = store
        .replay(dead, &spec.to_json(), spec.max_attempts(config))
        .await?;
    match outcome {
        ReplayOutcome::Revived => report.replayed.push(name),
        ReplayOutcome::AlreadyLive => report.already_live.push(name),
        ReplayOutcome::Gone => report.not_found.push(name),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections() {
        let ok = Selection {
            ids: vec!["a".into()],
            ..Selection::default()
        };
        assert!(ok.validate().is_ok());
        let all = Selection {
            all: true,
            topic: Some("payments".into()),
            ..Selection::default()
        };
        assert!(all.validate().is_ok());
        let nothing = Selection::default();
        assert_eq!(
            nothing.validate().expect_err("empty").field.as_deref(),
            Some("all")
        );
        let both = Selection {
            ids: vec!["a".into()],
            all: true,
            ..Selection::default()
        };
        assert!(both.validate().is_err());
        let bad_tenant = Selection {
            tenant: Some("Billing".into()),
            all: true,
            ..Selection::default()
        };
        let err = bad_tenant.validate().expect_err("bad tenant");
        assert_eq!(
            (err.code, err.field.as_deref()),
            ("invalid_tenant", Some("tenant"))
        );
        let bad_id = Selection {
            ids: vec!["ok".into(), "no spaces".into()],
            ..Selection::default()
        };
        assert_eq!(
            bad_id.validate().expect_err("bad").field.as_deref(),
            Some("ids[1]")
        );
    }

    #[test]
    fn since_forms() {
        assert_eq!(parse_since("1700000000000", "since"), Ok(1_700_000_000_000));
        assert_eq!(
            parse_since("2023-11-14T22:13:20Z", "since"),
            Ok(1_700_000_000_000)
        );
        let ago = parse_since("1h", "since").expect("duration");
        assert!((crate::job::now_ms() - ago - 3_600_000).abs() < 1000);
        assert!(parse_since("yesterday", "since").is_err());
    }
}
