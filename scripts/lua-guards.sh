#!/usr/bin/env bash
# Deletes each safety guard of the Lua scripts once and runs the test named
# for it against the broken script: every guard must be held by that test.
#
# Each GUARDS entry is `name | file | exact text | replacement | test`: the
# guard's text (it must occur once in its file) is replaced, and the test
# named (a full test path of the `it` binary, run with --exact, any module,
# `cluster::` included) must fail. Every named test is first run once with
# the scripts intact and must pass there ("TEST BROKEN" otherwise), so a
# flaky or unrelated failure cannot hold a guard. One line per guard:
#   held        the named test failed with the guard deleted
#   NOT HELD    it passed
#   TEST BROKEN it fails with the scripts intact (the guard is not judged)
#   BAD PATCH   the broken script did not compile in Redis
# and the exit status is 1 if any line is not "held".
#
# The scripts are compiled into the binaries (`include_str!`), so instead
# of a rebuild per guard (~40 s each on 2 cores) the script patches the
# built test binary and `target/debug/hookq` (which some tests run) in
# place: the replacement is padded with spaces to the guard's length (Lua
# ignores them), in every copy of its script's text in the binaries (the
# tests that drive a script directly hold a copy too). Where each script's
# copies are is found once (one read of each binary); a patch then writes
# only the guard's bytes there, and undoing it writes the original bytes
# back (copying both binaries, ~540 MB, for each guard took ~3.5 s of its
# ~5.5). Both binaries are copied whole once, and restored from the copies
# on exit. `--rebuild` edits
# lua/ and rebuilds instead (for a replacement longer than its guard).
#
#   scripts/lua-guards.sh [--rebuild] [--only PATTERN] [--suite-passed]
#       PATTERN: an extended regex; only the guards whose name or file
#       matches it are judged
#       --suite-passed: the caller has just run the whole suite with the
#       scripts intact, and it passed (scripts/test.sh): the named tests
#       are only checked to exist, not run once more intact (~2 minutes)
#   scripts/lua-guards.sh [--rebuild] [--only PATTERN] --whole [FILTER...]
#       the old mode: per guard, run the whole suite (or the test-name
#       FILTERs) and list every test that failed; "held" when any did (a
#       flaky test can hold a guard: for hunting a holder, not for proof)
#
# PENDING lists the guards no test holds yet, with what it would take; a run
# prints them last ("pending"), unjudged.
#
# Defence in depth, not held by a test (no behaviour can show it):
# - take_rate.lua `if granted < 0 then granted = 0 end`: only daemons
#   configured with different budgets for one host can take more than
#   one's budget; the rest of the script never grants more than it.
# - put_schedule.lua's NOT_FOUND for a change of a missing schedule: a
#   missing schedule reads version 0, and every change is computed from
#   version 1 or later, so the version check refuses it anyway (CHANGED;
#   the API reads again and answers 404).
# - drop_dead.lua's NOT_FOUND (`if found then return DONE end`): the store
#   finds the dead letter before calling it, so only a DELETE racing
#   another DELETE of the same letter gets there, and then the difference
#   is its answer (404 instead of 204): nothing is written either way.
# - index_dead.lua's check that an entry still exists: a pointer to a
#   letter dropped or replayed during the walk names an entry that
#   find_dead then does not find, the same answer as no pointer.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

# name | file | exact text | replacement | the test that holds it
E=engine G=guards F=fairness
GUARDS=(
  "complete: lease deadline|lua/complete_jobs.lua|      r = lease and (lease == token|      r = lease and (true or token|$E::a_stale_outcome_is_discarded_while_the_next_attempt_is_in_flight"
  "complete: lease held|lua/complete_jobs.lua|      r = lease and (lease == token|      r = true  or  (lease == token|$G::late_outcomes_of_a_reclaimed_attempt_change_nothing"
  "complete: a round's job is current only while its round lives|lua/complete_jobs.lua|    if round_lives[token] then|    if true then|rounds::an_expired_round_is_taken_back_but_for_its_delivered_jobs"
  "complete: an outcome sent again is current only while its record is live|lua/complete_jobs.lua|    if r and (keep or again[j]) then|    if r and (keep) then|rounds::an_outcome_sent_again_after_it_was_recorded_changes_nothing"
  "complete: a round ends with its last job|lua/complete_jobs.lua|  if rcall('HINCRBY', space .. 'round', token .. '#', -n) <= 0 then|  if rcall('HINCRBY', space .. 'round', token .. '#', -n) < -9 then|rounds::jobs_claimed_from_the_promotion_share_one_round_until_their_last_outcome"
  "rounds: a materialized round gives no lease to a job recorded already|lua/prelude.lua|      if r and rec_may_fly(r) then|      if true then|rounds::a_failure_or_a_cancel_in_a_round_leaves_the_others_to_complete"
  "rounds: a job in a live round is in flight|lua/prelude.lua|  if not token then return false end|  if true then return false end|rounds::a_failure_or_a_cancel_in_a_round_leaves_the_others_to_complete"
  "rounds: expired rounds are materialized by lease recovery|lua/reclaim_expired.lua|    round_materialize(space, token, leased_in)|    local _ = token|rounds::an_expired_round_is_taken_back_but_for_its_delivered_jobs"
  "rounds: an entry carries its job's partition|lua/claim_ready.lua|      entries[n + 1] = part_tag[parts and partition or -1]|      entries[n + 1] = due_tag(prefix)|rounds::jobs_claimed_from_the_promotion_share_one_round_until_their_last_outcome"
  "rounds: the claim's index forgets a round that ended|lua/prelude.lua|    if not live[token] then|    if false then|rounds::a_round_that_ended_no_longer_hides_its_jobs_from_a_claim"
  "claim: a job in a live round is not claimed again from a list|lua/claim_ready.lua|      and not (rounded and rounded[wheel_entry(prefix, id)]) then|      and true then|rounds::a_job_in_a_round_is_not_claimed_again_from_a_list"
  "fail: attempt token|lua/fail_job.lua|if not r or not rec_in_flight(r, KEYS[2], ARGV[1]) or rec_flight_attempt(r) ~= tonumber(ARGV[2]) then|if not r or not rec_in_flight(r, KEYS[2], ARGV[1]) then|$E::a_stale_outcome_is_discarded_while_the_next_attempt_is_in_flight"
  "fail: in flight (its lease)|lua/fail_job.lua|if not r or not rec_in_flight(r, KEYS[2], ARGV[1]) or rec_flight_attempt(r) ~= tonumber(ARGV[2]) then|if not r or rec_flight_attempt(r) ~= tonumber(ARGV[2]) then|$G::an_outcome_of_a_claim_given_back_changes_nothing"
  "defer: attempt token|lua/defer_jobs.lua|  if r and rec_in_flight(r, KEYS[1], id) and rec_flight_attempt(r) == token then|  if r and rec_in_flight(r, KEYS[1], id) then|$E::late_moves_change_nothing"
  "defer: in flight (its lease)|lua/defer_jobs.lua|  if r and rec_in_flight(r, KEYS[1], id) and rec_flight_attempt(r) == token then|  if r and rec_flight_attempt(r) == token then|$G::an_outcome_of_a_claim_given_back_changes_nothing"
  "park: attempt token|lua/park_jobs.lua|  if r and rec_in_flight(r, KEYS[1], id) and rec_flight_attempt(r) == token then|  if r and rec_in_flight(r, KEYS[1], id) then|$E::parked_jobs_keep_their_attempts_and_late_moves_change_nothing"
  "park: in flight (its lease)|lua/park_jobs.lua|  if r and rec_in_flight(r, KEYS[1], id) and rec_flight_attempt(r) == token then|  if r and rec_flight_attempt(r) == token then|$G::an_outcome_of_a_claim_given_back_changes_nothing"
  "park: attempt not counted|lua/park_jobs.lua|r.state, r.att, r.seq, r.ut = 'p', token - 1, seq, now|r.state, r.att, r.seq, r.ut = 'p', token, seq, now|$E::parked_jobs_keep_their_attempts_and_late_moves_change_nothing"
  "unpark: cancelled or changed jobs stay out|lua/unpark_jobs.lua|  if r and r.state == 'p' and r.seq == tonumber(string.sub(head[i], 1, 12), 16) then|  if r then|$E::parked_jobs_keep_their_attempts_and_late_moves_change_nothing"
  "probe: one probe at a time|lua/host_probe.lua|if state == 'half_open' and now >= (tonumber(f[3]) or 0) then|if state == 'half_open' then|$E::the_breaker_grants_one_probe_at_a_time"
  "breaker: opens only at the threshold|lua/host_failure.lua|if state == 'closed' and threshold > 0 and fails >= threshold then|if state == 'closed' and threshold > 0 then|$E::the_breaker_grants_one_probe_at_a_time"
  "claim: only ready jobs (tombstones skipped)|lua/claim_ready.lua|  elseif state and (state == 'r' or (state == 's' and due <= horizon)) and not leased[i]|  elseif state and not leased[i]|$G::a_cancelled_ready_jobs_tombstone_claims_no_later_job_of_its_id"
  "claim: only jobs due by the horizon (a change before the hand-over wins)|lua/claim_ready.lua|  elseif state and (state == 'r' or (state == 's' and due <= horizon)) and not leased[i]|  elseif state and (state == 'r' or (state == 's' and due <= 9e99)) and not leased[i]|ahead::a_change_before_the_hand_over_wins_over_a_promotion_ahead"
  "claim: a job in flight is not claimed again|lua/claim_ready.lua|  elseif state and (state == 'r' or (state == 's' and due <= horizon)) and not leased[i]|  elseif state and (state == 'r' or (state == 's' and due <= horizon))|$G::a_job_in_flight_is_not_claimed_again_when_its_id_comes_back"
  "claim: an id twice in one claim is claimed once|lua/claim_ready.lua|    if taken then taken[id] = true end|    if false then taken[id] = true end|$G::an_id_twice_in_one_claim_is_claimed_once"
  "promote: at most claim_ahead before the due time|lua/promote_due.lua|local horizon = now + tonumber(ARGV[2])|local horizon = now + ARGV[2] + 100|ahead::redis_hands_a_job_over_at_most_claim_ahead_before_its_due_time"
  "claim: the tenants set read again once a promotion started a list|lua/claim_ready.lua|  if started then tenants = rcall('SCARD', KEYS[5]) end|  if false then tenants = rcall('SCARD', KEYS[5]) end|$F::a_tenants_jobs_are_claimed_in_the_round_that_promotes_them"
  "batch: a failing call fails alone|lua/batch.lua|      local ok, result = pcall(call, keys, args)|      local ok, result = true, call(keys, args)|functions::claims_made_together_go_as_one_call_and_fail_alone"
  "reclaim: only jobs that may be in flight|lua/reclaim_expired.lua|  if r and rec_may_fly(r) and (r.state ~= 's' or r.due <= now) then|  if r then|$G::a_lease_left_behind_for_a_scheduled_job_does_not_run_it_early"
  "reclaim: a lease of a job due later was left by hand|lua/reclaim_expired.lua|  if r and rec_may_fly(r) and (r.state ~= 's' or r.due <= now) then|  if r and rec_may_fly(r) then|$G::a_lease_left_behind_for_a_scheduled_job_does_not_run_it_early"
  "reclaim: the lost attempt counts|lua/reclaim_expired.lua|    r.att = rec_flight_attempt(r)|    r.att = r.att|$E::a_lease_lost_on_the_last_attempt_dead_letters_the_job"
  "in flight: a layout-3 claim's attempt is its counter|lua/prelude.lua|  if r.state == 'i' then return r.att end|  if false then return r.att end|migrate::layout_3_migrates_by_its_version_and_its_claims_read_the_same"
  "reclaim: last attempt dead-letters|lua/reclaim_expired.lua|    if r.att >= r.max then|    if r.att > r.max then|$E::a_lease_lost_on_the_last_attempt_dead_letters_the_job"
  "cancel: finished jobs stay finished|lua/cancel_job.lua|if state == 'd' or state == 'x' then return WRONG_STATE end||api::a_finished_job_cannot_be_cancelled"
  "cancel: in-flight lease dropped|lua/cancel_job.lua|  rcall('ZREM', KEYS[3], ARGV[1])|  rcall('EXISTS', KEYS[3])|$E::late_moves_change_nothing"
  "cancel: a claimed job's cancel answers in flight|lua/cancel_job.lua|if flying then return IN_FLIGHT end||inflight::a_job_cancelled_mid_attempt_answers_202_and_is_not_retried"
  "cancel: a job in flight is known by its lease|lua/cancel_job.lua|local flying = rec_in_flight(r, KEYS[3], ARGV[1])|local flying = state == 'i'|ahead::a_job_handed_over_ahead_reads_in_flight_and_refuses_a_change"
  "cancel: a held job's cancel is announced|lua/cancel_job.lua|  rcall('PUBLISH', ARGV[3], 'x' .. ARGV[1])||inflight::a_job_held_for_its_busy_host_cancels_202_and_is_never_attempted"
  "replay: a live job is not replayed|lua/replay_dead.lua|if r and (r.state == 's' or r.state == 'w' or r.state == 'p' or r.state == 'r' or r.state == 'i' or r.state == 'o') then|if false then|ops::an_interrupted_replay_never_makes_two_live_jobs"
  "reschedule: only scheduled jobs|lua/reschedule_job.lua|if (r.state ~= 's' and r.state ~= 'w' and r.state ~= 'p' and r.state ~= 'o') or rec_ready(r, now)|if false|$E::late_moves_change_nothing"
  "reschedule: a job handed over ahead is in flight|lua/reschedule_job.lua|    or rec_in_flight(r, inflight, ARGV[1]) then|    then|ahead::a_job_handed_over_ahead_reads_in_flight_and_refuses_a_change"
  "reschedule: spec unchanged since read|lua/reschedule_job.lua|if r.spec ~= ARGV[9] then return {CHANGED, 'scheduled'} end||$E::late_moves_change_nothing"
  "enqueue: an existing id is not overwritten|lua/enqueue_jobs.lua|local r = live_r or (not elsewhere and rec_get(kept(prefix, id)))|local r = nil|api::create_is_idempotent_by_id"
  "enqueue: a re-create with another due time conflicts|lua/enqueue_jobs.lua|r.spec == spec and r.given == tonumber(ARGV[i + 6])|r.spec == spec|api::create_is_idempotent_by_id"
  "enqueue: a finished job's summary counts as existing|lua/enqueue_jobs.lua|local s = #done_index > 0 and summary_find(prefix, id, now, done_index)|local s = nil|footprint::finished_jobs_leave_summaries_that_still_answer"
  "cancel: a finished job's summary stays finished|lua/cancel_job.lua|    if summary then return WRONG_STATE end||$E::late_moves_change_nothing"
  "enqueue: a job behind its key's earlier jobs is held|lua/enqueue_jobs.lua|    if ahead ~= '' then|    if false then|ordering::cancel_and_dead_letter_of_the_head_release_the_next"
  "enqueue: a schedule's fire id is refused to a hand-made create|lua/enqueue_jobs.lua|  if ARGV[i + 9] ~= '' and rcall('HEXISTS', ARGV[i + 9], 'spec') == 1 then|  if false then|inputs::a_schedules_fire_ids_are_its_own"
  "order: only the head's finish releases the next|lua/prelude.lua|  if plan.head ~= id then|  if false then|ordering::cancel_and_dead_letter_of_the_head_release_the_next"
  "reschedule: a held job stays held|lua/reschedule_job.lua|if r.state == 'o' then|if false then|ordering::cancel_and_dead_letter_of_the_head_release_the_next"
  "place: a job that exists keeps its place|lua/place_jobs.lua|  elseif plan.exists then|  elseif false then|ordering::jobs_placed_by_their_key_are_found_by_id_and_pointers_are_swept"
  "unplace: a live job's pointer stays|lua/unplace_jobs.lua|    if ARGV[i + 2] == '1' then|    if false then|ordering::jobs_placed_by_their_key_are_found_by_id_and_pointers_are_swept"
)
S=schedules H=hosts
GUARDS+=(
  "fire: overlap skip while the last job is live|lua/fire_schedules.lua|local busy = skip_overlap and prev and prev ~= '' and rec_exists(live(prefix, prev))|local busy = false|$S::overlap_skip_fires_nothing_while_the_last_job_is_unfinished"
  "fire: a job behind its ordering list is held|lua/fire_schedules.lua|local behind = line and rcall('LLEN', line) > 0|local behind = false|$S::an_ordered_schedules_jobs_wait_in_line"
  "put: a create over other content conflicts|lua/put_schedule.lua|    return {CHANGED, old_version}||$S::every_second_fires_jobs_exactly_a_second_apart"
  "put: a change computed from an older version is refused|lua/put_schedule.lua|  if tostring(old_version) ~= ARGV[11] then return {CHANGED, old_version} end||$G::a_schedule_change_computed_from_an_older_version_is_refused"
  "put: a paused schedule leaves the fire index|lua/put_schedule.lua|if ARGV[8] == '1' or ARGV[9] == '' then|if ARGV[9] == '' then|$S::pause_resume_and_patch"
  "drop schedule: a missing schedule is not found|lua/drop_schedule.lua|if redis.call('HEXISTS', KEYS[3], 'meta') == 0 then return NOT_FOUND end||$S::bad_schedules_are_refused_naming_the_field"
  "rate: the budget starts again each window|lua/take_rate.lua|if tonumber(f[1]) == window then taken = tonumber(f[2]) or 0 end|taken = tonumber(f[2]) or 0|$H::two_daemons_share_one_rate_limit"
  "rate: no more than the budget per window|lua/take_rate.lua|local granted = math.min(tonumber(ARGV[3]), tonumber(ARGV[2]) - taken)|local granted = tonumber(ARGV[3])|$H::two_daemons_share_one_rate_limit"
  "resume: a closed host is not resumed|lua/host_resume.lua|if state == 'closed' then return UNCHANGED end||$G::only_a_probe_or_an_operator_closes_an_open_host"
  "resume: an expiry lifts only a paused host|lua/host_resume.lua|  if state ~= 'paused' or till == 0 or now < till then return UNCHANGED end|  if till == 0 or now < till then return UNCHANGED end|$G::only_a_probe_or_an_operator_closes_an_open_host"
  "success: only a probe closes a half-open host|lua/host_success.lua|if state == 'half_open' and ARGV[2] == '1' then|if state == 'half_open' then|$E::the_breaker_grants_one_probe_at_a_time"
  "failure: a failed probe reopens the host|lua/host_failure.lua|if state == 'half_open' and ARGV[6] == '1' then|if false then|$H::the_breaker_opens_probes_closes_and_jobs_keep_their_attempts"
  "fleet: a silent daemon leaves the fleet|lua/fleet_beat.lua|rcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)||fleet::a_killed_daemons_partitions_are_taken_over_within_the_bound"
  "claim: one EXISTS stands for the tenants set and the default list only when both are absent|lua/claim_ready.lua|local lists_empty = present % INDEX_WEIGHT == 0|local lists_empty = true|$F::a_claim_shares_its_batch_between_tenants_by_weight"
  "claim: the tenants' due index is skipped only when that EXISTS found it absent|lua/claim_ready.lua|local index_absent = present % WHEEL_WEIGHT < INDEX_WEIGHT|local index_absent = true|$F::a_tenants_jobs_are_claimed_in_the_round_that_promotes_them"
  "claim: the wheel's head is skipped only when that EXISTS found the wheel absent|lua/claim_ready.lua|local wheel_absent = present < WHEEL_WEIGHT|local wheel_absent = true|footprint::far_jobs_cascade_through_the_wheel_and_arrive_once_on_time"
  "wheel: buckets open by the horizon, before the due set's jobs of their time|lua/prelude.lua|  if wheel_head and wheel_head <= horizon then|  if wheel_head and wheel_head <= now then|ahead::a_promotion_ahead_opens_the_buckets_due_by_its_horizon"
  "wheel: tombstones skipped when a bucket opens|lua/prelude.lua|      if r and r.state == 'w' then|      if r then|$G::a_wheel_tombstone_does_not_reschedule_a_job_in_flight"
  "pause: a Retry-After never replaces an operator's pause|lua/host_pause.lua|  if current == 0 and till ~= 0 then return UNCHANGED end||$G::an_operators_pause_outlasts_a_retry_after_answer"
  "pause: a Retry-After never shortens a longer pause|lua/host_pause.lua|  if till ~= 0 and current >= till then return UNCHANGED end||$G::a_shorter_retry_after_never_shortens_a_pause"
  "resume: an expiry never lifts an operator's pause|lua/host_resume.lua|  if state ~= 'paused' or till == 0 or now < till then return UNCHANGED end|  if state ~= 'paused' or now < till then return UNCHANGED end|$G::an_operators_pause_outlasts_a_retry_after_answer"
  "resume: an expiry waits for the pause's end|lua/host_resume.lua|  if state ~= 'paused' or till == 0 or now < till then return UNCHANGED end|  if state ~= 'paused' or till == 0 then return UNCHANGED end|$G::a_shorter_retry_after_never_shortens_a_pause"
  "replay: a missing dead letter is not found|lua/replay_dead.lua|if #entry == 0 then return NOT_FOUND end||$G::a_dead_letter_replayed_twice_revives_its_job_once"
  "fire: a firing computed from an older version changes nothing|lua/fire_schedules.lua|tostring(m.ver) == ARGV[i + 2] and score|score|$G::stale_firings_change_nothing"
  "fire: a firing of a fire time already passed changes nothing|lua/fire_schedules.lua|    and tonumber(score) == tonumber(ARGV[i + 1])|    |$G::stale_firings_change_nothing"
  "fire: a fire time's job is created once|lua/fire_schedules.lua|        if not rec_exists(at) then|        if true then|$G::stale_firings_change_nothing"
  "pause: a second operator pause changes nothing|lua/host_pause.lua|  if till == 0 and current == 0 then return UNCHANGED end||$G::a_second_operator_pause_keeps_the_first"
  "dead letters: a pointer to a job's newer letter stays|lua/prelude.lua|  if id and redis.call('HGET', index, id) == entry then redis.call('HDEL', index, id) end|  if id then redis.call('HDEL', index, id) end|$G::dropping_a_jobs_older_dead_letter_keeps_its_newer_one_found"
  "dead letters: the stream is capped|lua/prelude.lua|  if over > 0 then|  if false then|security::dead_letters_are_found_by_id_without_reading_the_stream"
  "index dead: a pointer only moves to a newer letter|lua/index_dead.lua|  if newer and #redis.call('XRANGE', KEYS[1], entry, entry) > 0 then|  if #redis.call('XRANGE', KEYS[1], entry, entry) > 0 then|$G::a_stale_index_batch_keeps_a_jobs_newest_letter"
  "drain: only a closed host is drained|lua/host_drain.lua|if state ~= 'closed' or not score then return UNCHANGED end|if not score then return UNCHANGED end|$G::one_daemon_at_a_time_drains_a_closed_host"
  "drain: one drainer at a time|lua/host_drain.lua|  if score > now then return UNCHANGED end||$G::one_daemon_at_a_time_drains_a_closed_host"
  "drain: a noted host keeps its place in the blocked set|lua/host_drain.lua|  if score then return UNCHANGED end||$G::one_daemon_at_a_time_drains_a_closed_host"
  "migrate 1: converted keys are skipped|lua/migrate_jobs.lua|  if rcall('TYPE', key)['ok'] ~= 'hash' then|  if false then|$G::migrating_again_skips_records_already_converted"
  "migrate 2: only layout-2 records are converted|lua/migrate_records.lua|  if v and #v > 33 and string.sub(v, 34, 34) == '{' then|  if v and #v > 33 then|$G::migrating_again_skips_records_already_converted"
  "put: a create where a stub points elsewhere goes there|lua/put_schedule.lua|  if f[4] then return {ELSEWHERE, tonumber(f[4])} end||$G::a_schedule_id_has_one_schedule_ordered_or_not"
  "place schedule: a schedule here stays here|lua/place_schedule.lua|if f[1] then return here end||$G::a_schedule_id_has_one_schedule_ordered_or_not"
  "shared timers: each promoted id goes to its own partition's list|lua/prelude.lua|      if ready_push(home .. 'ready', by_partition[q]) then|      if ready_push(ready_key, by_partition[q]) then|timers::one_promotion_sends_every_partitions_jobs_to_their_own_lists"
  "shared timers: a wheel entry's job is found in its tag's partition|lua/prelude.lua|        home = home or prefix|        home = prefix|timers::a_fired_jobs_retry_waits_in_the_shared_wheel_and_is_sent"
  "outcomes together: each partition's leases are fenced in its own set|lua/complete_jobs.lua|    part = {prefix = prefix, hist = ARGV[i + 2], p = ARGV[i + 3], inflight = prefix .. 'inflight',|    part = {prefix = prefix, hist = ARGV[i + 2], p = ARGV[i + 3], inflight = KEYS[1],|functions::one_outcome_call_records_several_partitions_each_in_its_own"
  "outcomes together: each partition counts its own deliveries|lua/complete_jobs.lua|      stats = prefix .. 'stats', ids = {}, from = i + 6}|      stats = KEYS[2], ids = {}, from = i + 6}|functions::one_outcome_call_records_several_partitions_each_in_its_own"
  "ready push: a tenant's jobs wait in its own list|lua/prelude.lua|  if not slash then return key, nil end|  if true then return key, nil end|$F::a_tenants_backlog_does_not_hold_another_tenants_due_jobs"
  "promote: each tenant's due set gives a share|lua/prelude.lua|local DUE_TENANTS_PER_PROMOTION = '64'|local DUE_TENANTS_PER_PROMOTION = '0'|$F::a_tenants_due_backlog_does_not_hold_another_tenants_due_job"
  "promote: an emptied due set leaves the index|lua/prelude.lua|      redis.call('ZREM', index, set.tenant)||$F::a_tenants_due_backlog_does_not_hold_another_tenants_due_job"
  "due remove: a job leaves its tenant's due set|lua/prelude.lua|  redis.call('ZREM', key, member)||$F::a_tenants_due_backlog_does_not_hold_another_tenants_due_job"
  "claim: each tenant its weight|lua/prelude.lua|    if args[i] == tenant then return arg_number(args[i + 1]) end|    if false then return arg_number(args[i + 1]) end|$F::a_claim_shares_its_batch_between_tenants_by_weight"
  "claim: a dry tenant leaves the set|lua/claim_ready.lua|  if l.tenant and l.dry then rcall('SREM', KEYS[5], l.tenant) end|  if false then rcall('SREM', KEYS[5], l.tenant) end|$F::a_claim_shares_its_batch_between_tenants_by_weight"
  "claim: tenants left out of the pick mean more|lua/claim_ready.lua|if #ids == want or tenants > TENANTS_PER_CLAIM then out[2] = 1 end|if #ids == want then out[2] = 1 end|$F::a_claim_with_more_than_64_tenants_ready_comes_back_for_the_rest"
  "summaries: a shard made by a write expires with its bucket|lua/prelude.lua|        redis.call('PEXPIREAT', shard, expires, 'NX')|        redis.call('EXISTS', shard)|footprint::a_new_bucket_starts_with_the_shards_it_will_need"
  "summaries: a shard made by a split expires with its bucket|lua/prelude.lua|    redis.call('PEXPIREAT', dst, expires, 'NX')|    redis.call('EXISTS', dst)|footprint::a_shard_made_by_a_split_expires_with_its_bucket"
  "summaries: a write to a shard that exists sets no expiry (its mark was there)|lua/prelude.lua|unpack(args, 1, n)) > n / 2 then|unpack(args, 1, n)) >= 0 then|footprint::only_the_write_that_makes_a_shard_sets_its_expiry"
)

# Guards no test holds yet: name | file | text | replacement | why. Not
# judged (listed as "pending" at the end of a run); each is a test to write.
PENDING=(
)

mode=patch
only=""
filters=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --rebuild) mode=rebuild; shift ;;
    --whole) whole=1; shift; filters=("$@"); break ;;
    --only) only="$2"; shift 2 ;;
    --suite-passed) suite_passed=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
whole="${whole:-0}"
suite_passed="${suite_passed:-0}"
if [ "$whole" = 1 ] && [ "${#filters[@]}" -eq 0 ]; then
  filters=(--skip cluster:: --skip abuse:: --skip crash::kill_9 --skip crash::redis_sigkill)
fi

work="$(mktemp -d)"
cp lua/*.lua "$work/"
bins=()
# Undoes the last patch (see patch): the scripts' sources, and in the
# binaries the bytes it wrote (their originals are in $work/undo).
restore() {
  cp "$work"/*.lua lua/
  if [ -f "$work/undo" ]; then
    python3 - "$work/undo" <<'PY'
import json, sys
for binary, at, original in json.load(open(sys.argv[1])):
    with open(binary, "r+b") as f:
        f.seek(at)
        f.write(bytes.fromhex(original))
PY
    rm -f "$work/undo"
  fi
}
# On exit, whatever happened: the binaries from their whole copies.
restore_all() {
  cp "$work"/*.lua lua/
  for bin in "${bins[@]}"; do cp -p "$work/bin.$(basename "$bin")" "$bin"; done
}
trap 'restore_all; rm -rf "$work"' EXIT

# Builds the test binary (and target/debug/hookq with it); prints its path.
build() {
  cargo test --quiet --test it --no-run --message-format=json 2>"$work/build.err" | cargo_executable it
}

# Finds, in each binary, where every copy of each script named in
# `files` starts (rustc may keep one per codegen unit that uses it):
# $work/copies, read by patch.
find_copies() { # files...
  python3 - "$work" "${#bins[@]}" "${bins[@]}" "$@" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
bins, files = sys.argv[3:3 + n], sorted(set(sys.argv[3 + n:]))
copies = {}
for binary in bins:
    data = open(binary, "rb").read()
    for path in files:
        name = path.split("/")[-1]
        whole = open(f"{work}/{name}", "rb").read()
        found, start = [], data.find(whole)
        while start >= 0:
            found.append(start)
            start = data.find(whole, start + 1)
        if not found:
            sys.exit(f"{binary}: {name} is not in it as written in lua/")
        copies.setdefault(name, {})[binary] = found
json.dump(copies, open(f"{work}/copies", "w"))
PY
}

# Checks that `text` occurs once in `file`; writes the replaced file to
# stdout (rebuild mode) or patches the binaries in place, at every copy of
# the script (patch mode), keeping the bytes it overwrites in $work/undo.
patch() { # file text replacement
  python3 - "$mode" "$work" "$@" <<'PY'
import json, sys
mode, work, path, text, replacement = sys.argv[1:]
name = path.split("/")[-1]
source = open(f"{work}/{name}").read()
if source.count(text) != 1:
    sys.exit(f"{path}: the guard text occurs {source.count(text)} times: {text!r}")
if mode == "rebuild":
    open(path, "w").write(source.replace(text, replacement))
    sys.exit(0)
if len(replacement.encode()) > len(text.encode()):
    sys.exit(f"{path}: the replacement is longer than the guard; use --rebuild")
guard = text.encode()
offset = source.encode().find(guard)
new = replacement.encode().ljust(len(guard), b" ")
undo = []
for binary, starts in json.load(open(f"{work}/copies"))[name].items():
    with open(binary, "r+b") as f:  # in place: keeps the inode (hard links)
        for start in starts:
            f.seek(start + offset)
            if f.read(len(guard)) != guard:
                sys.exit(f"{binary}: {name} changed since its copies were found")
            undo.append([binary, start + offset, guard.hex()])
            f.seek(start + offset)
            f.write(new)
json.dump(undo, open(f"{work}/undo", "w"))
PY
}

# Runs the test binary: the named test alone, or the filters.
run_tests() { # log test
  if [ "$whole" = 1 ]; then
    (cd "$root" && timeout 1800 "$it" --quiet "${filters[@]}") >"$1" 2>&1
  else
    (cd "$root" && timeout 600 "$it" --exact "$2") >"$1" 2>&1
  fi
}

root="$(pwd)"
selected=()
files=()
for guard in "${GUARDS[@]}"; do
  IFS='|' read -r name file text replacement test <<<"$guard"
  if [ -z "$only" ] || echo "$name $file" | grep -Eq -- "$only"; then
    selected+=("$guard")
    files+=("$file")
  fi
done
if [ "${#selected[@]}" -eq 0 ]; then
  echo "no guard matches $only" >&2
  exit 2
fi

echo "== building the tests against the intact scripts"
start=$SECONDS
it="$(build)" || { cat "$work/build.err" >&2; exit 1; }
[ -x "$it" ] || { cat "$work/build.err" >&2; echo "no test binary" >&2; exit 1; }
if [ "$mode" = patch ]; then
  bins=("$it" "$root/target/debug/hookq")
  for bin in "${bins[@]}"; do cp -p "$bin" "$work/bin.$(basename "$bin")"; done
  find_copies "${files[@]}"
fi

# Each named test, once: it must pass with the scripts intact (run here,
# or the whole suite just was: --suite-passed), else it is "broken".
declare -A broken seen
if [ "$whole" = 0 ]; then
  if [ "$suite_passed" = 1 ]; then
    echo "== the whole suite passed with the scripts intact: each named test exists"
    "$it" --list 2>/dev/null | sed -n 's/: test$//p' >"$work/tests"
  else
    echo "== running each named test once with the scripts intact"
  fi
  for guard in "${selected[@]}"; do
    IFS='|' read -r name file text replacement test <<<"$guard"
    [ -n "${seen[$test]:-}" ] && continue
    seen[$test]=1
    log="$work/intact.$(echo "$test" | tr -c 'a-z0-9' '_').log"
    if [ "$suite_passed" = 1 ]; then
      grep -qxF -- "$test" "$work/tests" && continue
      echo "no test is named so" >"$log"
    elif run_tests "$log" "$test" && grep -q "^test result: ok. 1 passed" "$log"; then
      continue
    fi
    broken[$test]=1
    echo "TEST BROKEN $test fails with the scripts intact (or names no test):"
    tail -n 15 "$log" | sed 's/^/    /'
  done
fi

echo "== deleting each guard in turn"
failed=0
for guard in "${selected[@]}"; do
  IFS='|' read -r name file text replacement test <<<"$guard"
  restore
  if [ -n "${broken[$test]:-}" ]; then
    echo "TEST BROKEN $name ($file): $test"
    failed=1
    continue
  fi
  patch "$file" "$text" "$replacement"
  if [ "$mode" = rebuild ]; then
    it="$(build)" || { cat "$work/build.err" >&2; exit 1; }
  fi
  log="$work/guard.$(echo "$name" | tr -c 'a-z0-9' '_').log"
  t0=$SECONDS
  if run_tests "$log" "$test"; then
    echo "NOT HELD    $name ($file): ${test:-${filters[*]}} passed with it deleted"
    failed=1
  elif grep -q "Error compiling script" "$log"; then
    echo "BAD PATCH   $name ($file): the broken script does not compile"
    failed=1
  elif [ "$whole" = 1 ]; then
    failing="$(grep -E "^    [a-z_]+::[a-z0-9_:]+$" "$log" | tr -d ' ' | tr '\n' ' ')"
    echo "held        $name ($file): ${failing:-see $log} ($((SECONDS - t0)) s)"
  else
    why="$(grep -m1 -E "panicked at|timed out" -A1 "$log" | tail -n1 | cut -c1-110)"
    echo "held        $name ($file): $test ($((SECONDS - t0)) s) — $why"
  fi
done
restore
if [ -z "$only" ]; then
  for guard in "${PENDING[@]}"; do
    IFS='|' read -r name file text replacement why <<<"$guard"
    echo "pending     $name ($file): not judged, no test holds it yet: $why"
  done
fi
echo "== $((SECONDS - start)) s"
exit "$failed"
