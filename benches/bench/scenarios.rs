//! The catalogue: every scenario's name, sizes (full run and `--quick`) and
//! runs, in the order the report lists them (ingest, delivery, one host,
//! tenants, steady, fleet, lateness, memory, backlog, then
//! `memory_steady_load`); the
//! functions they call live in the module of their group. [`Rig`] is what
//! they share and runs each one.

use std::time::Duration;

use hookq::config::SigningMode;
use hookq::doctor::RECOMMENDED_LISTPACK_VALUE;

use crate::backlog::{console_paint, promotion};
use crate::common::start_redis;
use crate::delivery::{
    delivery_rate, delivery_rate_cluster, delivery_rate_ordered, hanging, many_hosts, one_host,
    open_host_backlog, rate_two_daemons, sign,
};
use crate::fleet::{fleet, round_trip_floor, steady};
use crate::ingest::{ingest_batch, ingest_single, ingest_single_wrk};
use crate::lateness::{lateness, lateness_with};
use crate::memory::{memory, memory_finished, memory_finished_retried, STOCK_LISTPACK_VALUE};
use crate::nginx::{Nginx, NGINX_SERVERS};
use crate::peers::{peer_bullmq, peer_bullmq_steady};
use crate::schedules::schedules_firing;
use crate::sink::Sink;
use crate::steady::memory_steady_load;
use crate::support::cluster::RedisCluster;
use crate::support::free_port;
use crate::support::redis::RedisServer;
use crate::tenants::tenants_fair;
use crate::{Figures, Options, Res, Scenario};

/// What every scenario shares: the command line, the bench's Redis, nginx
/// and sink.
struct Rig<'a> {
    opts: &'a Options,
    redis: &'a RedisServer,
    nginx: &'a Nginx,
    sink: &'a Sink,
}

impl Rig<'_> {
    /// `full` in a full run, `small` with `--quick`.
    fn size(&self, full: usize, small: usize) -> usize {
        if self.opts.quick {
            small
        } else {
            full
        }
    }

    /// Runs scenario `name` `runs` times, if `--only` wants it, and prints
    /// and keeps its report in `out`.
    async fn run<Fut>(
        &self,
        out: &mut Vec<Scenario>,
        name: &str,
        runs: usize,
        mut body: impl FnMut() -> Fut,
    ) -> Res<()>
    where
        Fut: std::future::Future<Output = Res<Figures>>,
    {
        if self.opts.wanted(name) {
            let mut figures = Vec::new();
            for _ in 0..runs {
                figures.push(body().await?);
            }
            out.push(Scenario::report_of(name, figures, serde_json::Map::new()));
        }
        Ok(())
    }
}

/// Runs every scenario `opts` asks for, in the order the report lists them,
/// on one Redis, one nginx and one sink.
pub async fn bench(opts: &Options) -> Res<Vec<Scenario>> {
    let redis = start_redis();
    let nginx = Nginx::start(NGINX_SERVERS).await?;
    let sink = Sink::start().await?;
    let rig = Rig {
        opts,
        redis: &redis,
        nginx: &nginx,
        sink: &sink,
    };
    let mut out = Vec::new();
    ingest_scenarios(&rig, &mut out).await?;
    delivery_scenarios(&rig, &mut out).await?;
    one_host_scenarios(&rig, &mut out).await?;
    tenant_scenarios(&rig, &mut out).await?;
    steady_scenarios(&rig, &mut out).await?;
    fleet_scenarios(&rig, &mut out).await?;
    lateness_scenarios(&rig, &mut out).await?;
    memory_scenarios(&rig, &mut out).await?;
    backlog_scenarios(&rig, &mut out).await?;
    // Last, and once whatever --runs says: 10 minutes in the full run.
    if opts.wanted("memory_steady_load") {
        let (figures, extra) = memory_steady_load(&redis, &nginx, opts.steady).await?;
        out.push(Scenario::report_of(
            "memory_steady_load",
            vec![figures],
            extra,
        ));
    }
    Ok(out)
}

/// Job creation through the API: batches and single requests, with and
/// without a replica acknowledging each write, and single creates from wrk.
async fn ingest_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, runs) = (rig.redis, rig.opts.runs);
    let batch = rig.size(100_000, 2_000);
    let single = rig.size(20_000, 500);
    for (name, acked) in [
        ("ingest_batch", false),
        ("ingest_batch_acked_1_replica", true),
    ] {
        rig.run(out, name, runs, move || ingest_batch(redis, batch, acked))
            .await?;
    }
    for (name, acked) in [
        ("ingest_single", false),
        ("ingest_single_acked_1_replica", true),
    ] {
        rig.run(out, name, runs, move || ingest_single(redis, single, acked))
            .await?;
    }
    let seconds = rig.size(5, 1) as u64;
    rig.run(out, "ingest_single_wrk", runs, move || {
        ingest_single_wrk(redis, seconds)
    })
    .await
}

/// Delivery rates to one nginx host: plain, ordered, signed, traced (with a
/// collector up and down), by the naive design and on a cluster; and
/// schedules firing.
async fn delivery_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, runs) = (rig.redis, rig.nginx, rig.opts.runs);
    let n = rig.size(100_000, 2_000);
    rig.run(out, "delivery_rate", runs, move || {
        delivery_rate(redis, nginx, n, false, |_| {})
    })
    .await?;
    let keys = rig.size(10_000, 200);
    rig.run(out, "delivery_rate_ordered", runs, move || {
        delivery_rate_ordered(redis, nginx, n, keys)
    })
    .await?;
    let (schedules, every_ms) = (rig.size(100_000, 200), rig.size(60_000, 1000) as i64);
    rig.run(out, "schedules_100k_every_minute", runs, move || {
        schedules_firing(redis, nginx, schedules, every_ms, 2)
    })
    .await?;
    for (name, mode) in [
        ("delivery_rate_signed_shared", SigningMode::Shared),
        ("delivery_rate_signed_per_origin", SigningMode::PerOrigin),
    ] {
        rig.run(out, name, runs, move || {
            delivery_rate(redis, nginx, n, false, move |c| sign(c, mode))
        })
        .await?;
    }
    let collector = &nginx.url(1, "");
    rig.run(out, "delivery_rate_traced", runs, move || {
        delivery_rate(redis, nginx, n, false, move |c| {
            c.telemetry.otlp_endpoint = collector.clone()
        })
    })
    .await?;
    rig.run(out, "delivery_rate_collector_down", runs, move || {
        delivery_rate(redis, nginx, n, false, |c| {
            c.telemetry.otlp_endpoint = format!("http://127.0.0.1:{}", free_port())
        })
    })
    .await?;
    rig.run(out, "delivery_rate_naive", runs, move || {
        delivery_rate(redis, nginx, n, true, |_| {})
    })
    .await?;
    if rig.opts.wanted("delivery_rate_cluster_3_masters") {
        let cluster = &RedisCluster::start_with(0);
        rig.run(out, "delivery_rate_cluster_3_masters", runs, move || {
            delivery_rate_cluster(cluster, nginx, n)
        })
        .await?;
    }
    Ok(())
}

/// One host at SPEC §11.6's bars: the default and lifted per-host limits
/// (measured together), BullMQ with `--peers`, and many healthy hosts beside
/// a hanging one.
async fn one_host_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, runs) = (rig.redis, rig.nginx, rig.opts.runs);
    let n = rig.size(100_000, 2_000);
    // One run measures both (the ratio is of rates from the same run).
    if rig.opts.wanted("one_host_default") || rig.opts.wanted("one_host_lifted") {
        let (mut default, mut lifted) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let (d, l) = one_host(redis, nginx, n).await?;
            default.push(d);
            lifted.push(l);
        }
        for (name, runs) in [("one_host_default", default), ("one_host_lifted", lifted)] {
            out.push(Scenario::report_of(name, runs, serde_json::Map::new()));
        }
    }
    if rig.opts.peers {
        let concurrency = rig.opts.peer_concurrency;
        rig.run(out, "peer_bullmq_one_host", runs, move || {
            peer_bullmq(redis, nginx, n, concurrency)
        })
        .await?;
    }
    let hanging = rig.size(10_000, 200);
    rig.run(out, "many_hosts_one_hanging", runs, move || {
        many_hosts(redis, nginx, n, hanging)
    })
    .await
}

/// SPEC §15's fair share between tenants.
async fn tenant_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, sink, runs) = (rig.redis, rig.nginx, rig.sink, rig.opts.runs);
    let (n, window) = (rig.size(200_000, 2_000), rig.size(10, 1) as u64);
    rig.run(out, "tenants_fair", runs, move || {
        tenants_fair(redis, nginx, sink, n, Duration::from_secs(window))
    })
    .await
}

/// The figure SPEC §16's ratio to BullMQ is taken of.
const REDIS_CPU: &str = "redis_cpu_us_per_job";

/// SPEC §16's steady load: jobs due one every 1/rate s, at 200 jobs/s (with
/// BullMQ beside it under `--peers`: run in pairs, hookq then BullMQ, and
/// each pair's Redis CPU per job as a percentage of BullMQ's is
/// `redis_cpu_pct_of_bullmq`)
/// and 2,000 jobs/s (one daemon, twenty); at each rate one daemon with 4
/// partitions too, a tuned setting shown beside.
async fn steady_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, runs) = (rig.redis, rig.nginx, rig.opts.runs);
    // 15 s at 200 jobs/s, 10 s at 2,000 (`--quick`: 1 s and 0.25 s).
    let seconds_200 = rig.size(15, 1) as f64;
    let concurrency = rig.opts.peer_concurrency;
    if rig.opts.peers && rig.opts.wanted("steady_200") && rig.opts.wanted("peer_bullmq_steady_200")
    {
        // SPEC §16's bar is a ratio of the same run: each of hookq's runs
        // is followed by one of BullMQ's, so that the host's drift from one
        // minute to the next (±30 % here) falls on both alike, and each
        // pair gives a ratio of its own.
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let mut hookq = steady(redis, nginx, 1, 200, seconds_200, None).await?;
            let bullmq = peer_bullmq_steady(redis, nginx, 200, seconds_200, concurrency).await?;
            let theirs_cpu = bullmq.get(REDIS_CPU).copied().filter(|b| *b > 0.0);
            if let (Some(a), Some(b)) = (hookq.get(REDIS_CPU).copied(), theirs_cpu) {
                hookq.insert("redis_cpu_pct_of_bullmq", 100.0 * a / b);
            }
            ours.push(hookq);
            theirs.push(bullmq);
        }
        let fields = serde_json::Map::new;
        out.push(Scenario::report_of("steady_200", ours, fields()));
        out.push(Scenario::report_of(
            "peer_bullmq_steady_200",
            theirs,
            fields(),
        ));
    } else {
        rig.run(out, "steady_200", runs, move || {
            steady(redis, nginx, 1, 200, seconds_200, None)
        })
        .await?;
        if rig.opts.peers {
            rig.run(out, "peer_bullmq_steady_200", runs, move || {
                peer_bullmq_steady(redis, nginx, 200, seconds_200, concurrency)
            })
            .await?;
        }
    }
    // Beside it, a tuned setting: 4 partitions, so that a round visits
    // fewer partitions for the same jobs (docs/performance.md).
    rig.run(out, "steady_200_4_partitions", runs, move || {
        steady(redis, nginx, 1, 200, seconds_200, Some(4))
    })
    .await?;
    let seconds_2000 = rig.size(40, 1) as f64 / 4.0;
    // The last one is a tuned setting, shown beside the default: fewer
    // partitions, so fewer claims and outcome calls per round.
    for (name, daemons, partitions) in [
        ("steady_2000", 1, None),
        ("steady_2000_20_daemons", 20, None),
        ("steady_2000_4_partitions", 1, Some(4)),
    ] {
        rig.run(out, name, runs, move || {
            steady(redis, nginx, daemons, 2000, seconds_2000, partitions)
        })
        .await?;
    }
    Ok(())
}

/// SPEC §13's fleets and their round-trip floor, then the shared per-host
/// rate of two daemons and an open host's backlog.
async fn fleet_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, runs) = (rig.redis, rig.nginx, rig.opts.runs);
    let n = rig.size(2_000, 200);
    let idle = Duration::from_secs(rig.size(5, 1) as u64);
    for daemons in [1, 5, 20] {
        rig.run(out, &format!("fleet_{daemons}_daemons"), runs, move || {
            fleet(redis, nginx, daemons, n, idle)
        })
        .await?;
    }
    rig.run(out, "fleet_round_trip_floor", runs, move || {
        round_trip_floor(redis, n)
    })
    .await?;
    let idle = Duration::from_secs(rig.size(10, 1) as u64);
    rig.run(out, "fleet_idle_50_daemons", runs, move || {
        fleet(redis, nginx, 50, 0, idle)
    })
    .await?;
    let (jobs, rate) = (
        rig.size(10_000, 250),
        if rig.opts.quick { 50.0 } else { 2000.0 },
    );
    rig.run(out, "rate_two_daemons", runs, move || {
        rate_two_daemons(redis, nginx, jobs, rate)
    })
    .await?;
    let (jobs, window) = (
        rig.size(10_000, 200),
        Duration::from_millis(rig.size(10_000, 500) as u64),
    );
    rig.run(out, "open_host_backlog", runs, move || {
        open_host_backlog(redis, nginx, jobs, window)
    })
    .await
}

/// Lateness at the sink: idle (one daemon, twenty, the naive design) and at
/// 2,000 jobs/s (hookq, the naive design).
async fn lateness_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, sink, runs) = (rig.redis, rig.sink, rig.opts.runs);
    let idle = rig.size(40, 5);
    rig.run(out, "lateness_idle", runs, move || {
        lateness(redis, sink, 0, idle, false)
    })
    .await?;
    rig.run(out, "lateness_idle_20_daemons", runs, move || {
        lateness_with(redis, sink, 0, idle, false, 20)
    })
    .await?;
    let idle_naive = rig.size(20, 3);
    rig.run(out, "lateness_idle_naive", runs, move || {
        lateness(redis, sink, 0, idle_naive, true)
    })
    .await?;
    let (rate, seconds) = (rig.size(2000, 200), rig.size(10, 2));
    for (name, naive) in [
        ("lateness_2000_per_s", false),
        ("lateness_2000_per_s_naive", true),
    ] {
        rig.run(out, name, runs, move || {
            lateness(redis, sink, rate, seconds, naive)
        })
        .await?;
    }
    Ok(())
}

/// Redis memory per job, once each: scheduled (stock and tuned Redis, mixed
/// bodies) and finished (stock and tuned, bodies kept).
async fn memory_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let redis = rig.redis;
    let (stock, tuned) = (STOCK_LISTPACK_VALUE, RECOMMENDED_LISTPACK_VALUE);
    let (million, finished) = (rig.size(1_000_000, 10_000), rig.size(100_000, 2_000));
    for (name, n, listpack_value, mixed) in [
        ("memory_10k_scheduled", 10_000, stock, false),
        ("memory_1m_scheduled", million, stock, false),
        ("memory_1m_scheduled_mixed_bodies", million, stock, true),
        ("memory_1m_scheduled_tuned_redis", million, tuned, false),
    ] {
        rig.run(out, name, 1, move || {
            memory(redis, n, listpack_value, mixed)
        })
        .await?;
    }
    for (name, listpack_value, keep_bodies) in [
        ("memory_100k_finished", stock, false),
        ("memory_100k_finished_tuned_redis", tuned, false),
        ("memory_100k_finished_keep_bodies", stock, true),
    ] {
        rig.run(out, name, 1, move || {
            memory_finished(redis, finished, listpack_value, keep_bodies)
        })
        .await?;
    }
    rig.run(out, "memory_100k_finished_10pct_retried", 1, move || {
        memory_finished_retried(redis, finished)
    })
    .await?;
    Ok(())
}

/// What a large backlog costs: promotion beside 10k and 1m parked jobs, the
/// console's first paint over 1m, and one host's rate beside a hanging one.
async fn backlog_scenarios(rig: &Rig<'_>, out: &mut Vec<Scenario>) -> Res<()> {
    let (redis, nginx, runs) = (rig.redis, rig.nginx, rig.opts.runs);
    let due = rig.size(10_000, 1_000);
    for (name, parked, runs) in [
        ("promotion_10k_scheduled", rig.size(10_000, 1_000), runs),
        (
            "promotion_1m_scheduled",
            rig.size(1_000_000, 10_000),
            rig.size(runs, 1),
        ),
    ] {
        rig.run(out, name, runs, move || promotion(redis, parked, due))
            .await?;
    }
    let (jobs, loads) = (rig.size(1_000_000, 10_000), rig.size(5, 1));
    rig.run(out, "console_first_paint_1m", 1, move || {
        console_paint(redis, jobs, loads)
    })
    .await?;
    let n = rig.size(100_000, 1_000);
    rig.run(out, "hanging_endpoint", runs, move || {
        hanging(redis, nginx, n)
    })
    .await
}
