//! One summary per conversation at a time, across replicas: a lease in the store names the job
//! (replica, attempt, the prefix it summarizes); others wait for its checkpoint when it covers a
//! prefix of theirs, and whoever takes the lease reads the store again before summarizing (what
//! it read before may predate a checkpoint stored by the job that held the lease last). Also the
//! backoff guard, which stops compacting, for a while that grows with
//! each further failure, conversations whose compactions fail or free nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::identity::{self, Hash};
use crate::store::Checkpoint;

use super::compact::SummaryOrder;
use super::conversation::{covers_all, matches_prefix, Conversation};
use super::plan::Plan;
use super::{Engine, Mode, Status, SummaryError, Trigger};

/// How often a request waiting for another's summary looks for the result.
const WAIT_POLL: Duration = Duration::from_millis(40);

/// Conversations whose unproductive compactions are remembered at once, at most before those
/// whose backoff has passed are forgotten: a conversation that failed and was never seen again
/// would otherwise stay for the life of the process.
const UNPRODUCTIVE_REMEMBERED: usize = 10_000;

/// A lease holder names the job: who, which attempt, and the prefix it summarizes.
fn holder_name(replica: &str, attempt: u64, covered: usize, prefix: &str) -> String {
    format!("{replica}.{attempt}/{covered}/{prefix}")
}

fn holder_job(holder: &str) -> Option<(usize, &str)> {
    let mut parts = holder.splitn(3, '/');
    parts.next()?;
    let covered = parts.next()?.parse().ok()?;
    Some((covered, parts.next()?))
}

impl Engine {
    /// Makes (or waits for) a checkpoint for this conversation. Returns it and whether this call
    /// wrote a new summary. Everything it does, waiting for another request's summary and then
    /// writing its own when that one failed, ends by `summary_timeout_ms` after `started`.
    pub(super) async fn compact(
        self: &Arc<Self>,
        conversation: &Conversation,
        base: Option<&Checkpoint>,
        trigger: Trigger,
        started: Instant,
    ) -> Result<(Checkpoint, bool), SummaryError> {
        let anchor = conversation.anchor.ok_or(SummaryError::Nothing)?;
        let lease_key = format!("lease:{}", identity::hex(&anchor));
        let deadline = started + Duration::from_millis(self.config.summary_timeout_ms);
        // A checkpoint of clearing alone summarizes nothing: the summary starts from scratch
        // (a summary request that continues the conversation still goes through its stubs).
        let sent_through = base.filter(|b| b.covered == 0).cloned();
        let mut base = base.filter(|b| b.covered > 0).cloned();
        loop {
            let plan = self.plan(conversation, base.as_ref(), trigger)?;
            let prefix = identity::hex(&conversation.chain[plan.cut - 1]);
            let attempt = self.attempts.fetch_add(1, Ordering::Relaxed);
            let holder = holder_name(&self.replica, attempt, plan.cut, &prefix);
            let ttl = Duration::from_millis(self.config.summary_timeout_ms + 10_000);
            // Draining, a request may still wait for a summary being written, never start one.
            let leased = !self.is_draining()
                && match self.store.try_lease(&lease_key, &holder, ttl).await {
                    Ok(leased) => leased,
                    Err(e) => {
                        self.metrics.store_errors.inc();
                        tracing::warn!(error = %e, "Taking the summary lease failed; summarizing without it.");
                        true
                    }
                };
            if leased {
                let job = Job {
                    base,
                    sent_through: sent_through.clone(),
                    plan,
                    trigger,
                    lease_key: lease_key.clone(),
                    holder,
                    deadline,
                };
                match self.summarize_detached(conversation, job).await? {
                    Leased::Written(cp) => return Ok((cp, true)),
                    Leased::Found(cp) if self.enough(conversation, &cp) => return Ok((cp, false)),
                    // Another replica's checkpoint helps but is not enough: extend it.
                    Leased::Found(cp) => {
                        base = Some(cp);
                        continue;
                    }
                }
            }
            // Someone else is summarizing this conversation. Wait for their result if it is a
            // prefix of ours; an edited history (a job on another prefix) does not wait.
            let other = self.store.lease_holder(&lease_key).await.ok().flatten();
            let theirs = other.as_deref().and_then(holder_job);
            let ours = theirs.is_some_and(|(covered, prefix)| {
                covered > 0
                    && conversation
                        .chain
                        .get(covered - 1)
                        .is_some_and(|h| identity::hex(h) == prefix)
            });
            if !ours && self.is_draining() {
                return Err(SummaryError::Draining);
            }
            if other.is_some() && !ours {
                let result = self
                    .summarize_and_store(
                        conversation,
                        SummaryOrder {
                            base: base.as_ref(),
                            sent_through: sent_through.as_ref(),
                            plan: &plan,
                            trigger,
                            deadline,
                        },
                    )
                    .await;
                return result.map(|cp| (cp, true));
            }
            loop {
                let now = Instant::now();
                if now >= deadline {
                    return Err(SummaryError::Timeout);
                }
                tokio::time::sleep(WAIT_POLL.min(deadline - now)).await;
                if let Some(cp) = self.newer_checkpoint(conversation, base.as_ref()).await {
                    if self.enough(conversation, &cp) {
                        return Ok((cp, false));
                    }
                    // Their checkpoint helps but is not enough: extend it.
                    base = Some(cp);
                    break;
                }
                if self
                    .store
                    .lease_holder(&lease_key)
                    .await
                    .ok()
                    .flatten()
                    .is_none()
                {
                    break;
                }
            }
        }
    }

    /// The newest stored checkpoint that matches the conversation and covers more than `base`:
    /// one written since `base` was read.
    async fn newer_checkpoint(
        &self,
        conversation: &Conversation,
        base: Option<&Checkpoint>,
    ) -> Option<Checkpoint> {
        let anchor = identity::hex(&conversation.anchor?);
        let list = self.store.for_anchor(&anchor).await.ok()?;
        list.iter()
            .find(|c| {
                matches_prefix(c, &conversation.chain) && c.covered > base.map_or(0, |b| b.covered)
            })
            .cloned()
    }

    /// Whether another request's checkpoint serves this one, so that it needs no summary of
    /// its own.
    fn enough(&self, conversation: &Conversation, checkpoint: &Checkpoint) -> bool {
        match conversation.context.mode {
            Mode::Force => true,
            Mode::Whole => covers_all(checkpoint, conversation),
            Mode::Auto | Mode::Off => {
                self.fits(conversation, &self.view(conversation, Some(checkpoint)))
            }
        }
    }

    /// Writes the summary under the lease in a task of its own, which releases the lease when
    /// done. A client that goes away mid-summary (a cancelled request) leaves the task running:
    /// its checkpoint is still stored, and the conversation's next request, waiting on the lease,
    /// gets it as soon as it is written instead of waiting out a lease nobody would release.
    ///
    /// The store is read again first, under the lease: what the request read before taking it
    /// may predate a checkpoint another replica stored and then released the lease on (the
    /// holder stores before it releases, so a read under the lease sees every finished job).
    /// That checkpoint is returned instead of summarizing the same span again.
    async fn summarize_detached(
        self: &Arc<Self>,
        conversation: &Conversation,
        job: Job,
    ) -> Result<Leased, SummaryError> {
        let engine = self.clone();
        // The task outlives the borrowed conversation: it takes a copy (counts and chain, not
        // counted or hashed again).
        let conversation = conversation.clone();
        let task = self.tasks.spawn(async move {
            let result = match engine
                .newer_checkpoint(&conversation, job.base.as_ref())
                .await
            {
                Some(found) => Ok(Leased::Found(found)),
                None => engine
                    .summarize_and_store(
                        &conversation,
                        SummaryOrder {
                            base: job.base.as_ref(),
                            sent_through: job.sent_through.as_ref(),
                            plan: &job.plan,
                            trigger: job.trigger,
                            deadline: job.deadline,
                        },
                    )
                    .await
                    .map(Leased::Written),
            };
            if let Err(e) = engine
                .store
                .release_lease(&job.lease_key, &job.holder)
                .await
            {
                tracing::warn!(error = %e, "Releasing the summary lease failed; it will expire.");
            }
            result
        });
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only a runtime shutting down cancels the task.
            Err(_) => Err(SummaryError::Timeout),
        }
    }

    /// The backoff guard: after `max_unproductive_compactions` compactions in a row that failed
    /// or freed nothing, a conversation is served without a new summary until its backoff has
    /// passed. The first request after that is let through to try again; requests arriving
    /// while it tries are still served without a summary, so a summarizer that is down sees one
    /// attempt per backoff, not one per request. Asking explicitly (`force`) always tries.
    pub(super) fn backing_off(&self, conversation: &Conversation) -> Option<Status> {
        if conversation.context.mode == Mode::Force {
            return None;
        }
        let mut state = self.unproductive.get_mut(&conversation.anchor?)?;
        if state.in_a_row < self.config.max_unproductive_compactions {
            return None;
        }
        let now = Instant::now();
        if now >= state.retry_at {
            // This request tries again. Should it never report back (its client went away),
            // the next one may try once the attempt would have timed out.
            state.retry_at = later(now, Duration::from_millis(self.config.summary_timeout_ms));
            return None;
        }
        Some(Status::BackingOff {
            retry_in: state.retry_at - now,
            fallback: "original",
        })
    }

    pub(super) fn note_progress(&self, anchor: Option<Hash>, productive: bool) {
        let Some(anchor) = anchor else { return };
        if productive {
            self.unproductive.remove(&anchor);
            return;
        }
        let now = Instant::now();
        forget_passed_backoffs(&self.unproductive, &anchor, now);
        let mut state = self.unproductive.entry(anchor).or_insert(Unproductive {
            in_a_row: 0,
            retry_at: now,
        });
        state.in_a_row = state.in_a_row.saturating_add(1);
        let beyond = state
            .in_a_row
            .saturating_sub(self.config.max_unproductive_compactions);
        state.retry_at = later(now, self.backoff(beyond));
    }

    /// The wait before the next attempt after `beyond` failures past the allowed number:
    /// the base, doubled for each, capped.
    fn backoff(&self, beyond: u32) -> Duration {
        let base = self.config.retry_backoff_base_ms;
        let wait = base.saturating_mul(1u64.checked_shl(beyond).unwrap_or(u64::MAX));
        Duration::from_millis(wait.min(self.config.retry_backoff_max_ms))
    }
}

/// Before `anchor` is added to a full `unproductive`: forgets the conversations whose backoff
/// has passed (one seen again starts counting anew).
fn forget_passed_backoffs(
    unproductive: &dashmap::DashMap<Hash, Unproductive>,
    anchor: &Hash,
    now: Instant,
) {
    if unproductive.len() >= UNPRODUCTIVE_REMEMBERED && !unproductive.contains_key(anchor) {
        unproductive.retain(|_, state| state.retry_at > now);
    }
}

/// `now + wait`, or a year from now when a configured wait is too long for the clock.
fn later(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// What a job under the lease came to.
enum Leased {
    /// It wrote this checkpoint.
    Written(Checkpoint),
    /// The store already had this newer checkpoint (another replica's): nothing was written.
    Found(Checkpoint),
}

/// A summary to write under a lease, owned so that it can outlive its request.
struct Job {
    base: Option<Checkpoint>,
    sent_through: Option<Checkpoint>,
    plan: Plan,
    trigger: Trigger,
    lease_key: String,
    holder: String,
    /// When the request it was started for gives up (`summary_timeout_ms` after it began).
    deadline: Instant,
}

/// A conversation's compactions in a row that failed or freed nothing, and when the next may
/// be tried once there were too many.
pub(super) struct Unproductive {
    in_a_row: u32,
    retry_at: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_holders_name_their_job() {
        let h = holder_name("r1", 7, 12, "abcd");
        assert_eq!(holder_job(&h), Some((12, "abcd")));
        assert_eq!(holder_job("garbage"), None);
    }

    #[test]
    fn a_full_memory_of_failures_forgets_only_the_passed_backoffs() {
        let now = Instant::now();
        let map = dashmap::DashMap::new();
        for i in 0..UNPRODUCTIVE_REMEMBERED as u32 {
            let mut anchor = [0u8; 32];
            anchor[..4].copy_from_slice(&i.to_le_bytes());
            let retry_at = if i % 2 == 0 {
                now - Duration::from_millis(1)
            } else {
                now + Duration::from_secs(60)
            };
            map.insert(
                anchor,
                Unproductive {
                    in_a_row: 3,
                    retry_at,
                },
            );
        }
        let known = [0u8; 32];
        forget_passed_backoffs(&map, &known, now);
        assert_eq!(
            map.len(),
            UNPRODUCTIVE_REMEMBERED,
            "a known one is updated in place"
        );
        forget_passed_backoffs(&map, &[9u8; 32], now);
        assert_eq!(map.len(), UNPRODUCTIVE_REMEMBERED / 2);
        assert!(map.iter().all(|entry| entry.retry_at > now));
    }
}
