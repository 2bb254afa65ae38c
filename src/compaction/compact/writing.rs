//! Writing a summary: the span cut into chunks that fit the summarizer's window, each asked of
//! the summarizer and folded into the running text oldest first (a span past
//! `max_summary_chunks` refused), the progress of a long fold stored as it goes, and the record
//! attached to the model's text at the end. A summarizer that refuses a chunk as too long
//! teaches its window, and the span is written once more in smaller chunks.

use super::super::render::render_through;
use super::super::summarizer::SummarizerError;
use super::super::{prompt, record, Engine, SentCount, SummaryError};
use super::{Fold, Progress};
use crate::dialect::SummaryRequest;
use crate::measure::calibration::Correction;
use crate::tokenizer::{Encoding, REPLY_PRIMING};

use super::super::conversation::Conversation;

impl Engine {
    /// Summarizes `span`, folding it into `previous`, in chunks that fit the summarizer.
    pub(super) async fn write_summary(
        &self,
        conversation: &Conversation,
        fold: Fold<'_>,
    ) -> Result<String, SummaryError> {
        if fold.span.is_empty() {
            return Err(SummaryError::Nothing);
        }
        let model = self.summary_model(conversation);
        if let Some(summary) = self
            .write_summary_continuing(conversation, &fold, &model)
            .await?
        {
            return Ok(summary);
        }
        // A summarizer that refuses a chunk as too long teaches its window (or, configured, has
        // it halved for this span), and the span is summarized once more in smaller chunks.
        let mut shrink = 1;
        let mut retried = false;
        loop {
            match self
                .write_summary_in_chunks(conversation, &fold, &model, shrink)
                .await
            {
                Err(SummaryError::Summarizer(SummarizerError::Overflow(overflow))) if !retried => {
                    retried = true;
                    // A stated window is learned and used as it is; without one (or with a
                    // configured summarizer window) the window is halved for this span.
                    let stated = overflow.limit.filter(|_| overflow.trusted);
                    if stated.is_some() && self.summarizer.window == 0 {
                        // The provider's count stands in for ours: only its stated window is
                        // learned from it. A summary request is text alone (media are
                        // placeholders in its transcript).
                        let counted = SentCount {
                            raw: overflow.requested.unwrap_or(0),
                            tenant: conversation.tenant,
                            countable: true,
                            ..SentCount::default()
                        };
                        self.learn_overflow(&model, overflow, counted).await;
                    } else {
                        shrink = 2;
                    }
                }
                Err(SummaryError::Summarizer(SummarizerError::Overflow(_))) => {
                    return Err(SummaryError::SummarizerOverflow)
                }
                other => return other,
            }
        }
    }

    /// The summary asked as a continuation of the conversation: the request as it was last
    /// forwarded (through `fold.base`), cut where the span ends, and one user message asking
    /// for the summary. Its provider reads that prefix from its prompt cache, where the
    /// standalone request pays its transcript as fresh input. `Ok(None)` when the summarizer
    /// cannot be asked so (another provider or model, a format that cannot be cut, a prefix
    /// that would not fit its window) or its answer cannot be used (an error, no text): the
    /// standalone request is written then. Only running out of time is an error.
    async fn write_summary_continuing(
        &self,
        conversation: &Conversation,
        fold: &Fold<'_>,
        model: &str,
    ) -> Result<Option<String>, SummaryError> {
        let request = &conversation.request;
        let summarizer = self.summarizer_for(request.dialect());
        if !summarizer.continues_conversations() || model != request.model() {
            return Ok(None);
        }
        let end = fold.plan.cut.min(request.len());
        let Some(prefix) = request.prefix_copy(end) else {
            return Ok(None);
        };
        // The conversation's own model: its window is the conversation's.
        let window = conversation.window;
        let allowance = self.summary_allowance(window);
        let max_tokens = record::model_allowance(allowance);
        let encoding = Encoding::for_model(model);
        // The summary message the prefix opens with (a base that only cleared has none).
        let previous = fold
            .base
            .filter(|b| b.covered > 0)
            .map(|b| self.summary_text(b));
        let instructions: Vec<&str> = [
            self.config.instructions.as_str(),
            conversation.context.instructions.as_deref().unwrap_or(""),
        ]
        .into_iter()
        .collect();
        let user = prompt::continuation_prompt(previous.is_some(), &instructions, max_tokens);
        // As the requests were forwarded: through the summary, or the clearing alone.
        let through = fold.base.or(fold.sent_through);
        let prefix_tokens = match through {
            Some(through) => self.view_until(conversation, through, end).tokens,
            None => {
                conversation.measured.head_tokens
                    + conversation.message_tokens[..end].iter().sum::<u64>()
                    + REPLY_PRIMING
            }
        };
        let prompt_tokens = prefix_tokens + encoding.count(&user);
        let room = window.saturating_sub(self.config.margin_tokens.min(window / 16));
        if conversation.correction.apply(prompt_tokens) + max_tokens > room {
            return Ok(None);
        }
        let body = match through {
            Some(through) => render_through(
                prefix.as_ref(),
                &conversation.message_tokens,
                through,
                previous.as_deref().unwrap_or_default(),
                self.config.merge_summary_into_user,
            ),
            None => prefix.original_body(),
        };
        let summary_request = SummaryRequest {
            model,
            system: "",
            user: &user,
            max_tokens,
            conversation: Some(&body),
        };
        self.metrics.summary_requests.inc();
        let answer = summarizer
            .summarize(&summary_request, &conversation.context.credentials)
            .await;
        let text = match answer {
            Ok(answer) => {
                // What is left once the request's own wording, echoed, is taken out.
                let text = prompt::clean_answer(&answer);
                if text.is_empty() {
                    tracing::info!(
                        "A summary asked as a continuation of the conversation came back without text of its own; asking for it on its own."
                    );
                }
                text
            }
            Err(SummarizerError::Timeout) => {
                return Err(SummaryError::Summarizer(SummarizerError::Timeout))
            }
            Err(error) => {
                tracing::warn!(
                    cause = %super::super::summarizer::with_causes(&error),
                    "A summary asked as a continuation of the conversation failed; asking for it on its own."
                );
                String::new()
            }
        };
        let used = !text.is_empty();
        let result = if used { "used" } else { "fell_back" };
        self.metrics
            .summary_continuations
            .get_or_create(&crate::metrics::ResultLabel { result })
            .inc();
        if !used {
            return Ok(None);
        }
        let previous = fold.base.map(|b| b.summary.as_str());
        Ok(Some(record::attach(
            &text, fold.views, previous, encoding, allowance,
        )))
    }

    /// [`Engine::write_summary`] with the summarizer's window divided by `shrink`.
    async fn write_summary_in_chunks(
        &self,
        conversation: &Conversation,
        fold: &Fold<'_>,
        model: &str,
        shrink: u64,
    ) -> Result<String, SummaryError> {
        let (span, views) = (fold.span, fold.views);
        let previous = fold.base.map(|b| b.summary.as_str());
        let window = if self.summarizer.window > 0 {
            self.summarizer.window
        } else {
            self.window_for(model).await
        } / shrink;
        let allowance = self.summary_allowance(conversation.window.min(window));
        // The model writes at most its part; the record fills what the model leaves.
        let max_tokens = record::model_allowance(allowance);
        let encoding = Encoding::for_model(model);
        // The conversation's correction, never below our own count (the summarizer may be
        // another model).
        let correction = conversation.correction;
        let usable = Correction {
            factor: correction.factor.max(1.0),
            ..correction
        }
        .unscale(
            window
                .saturating_sub(self.config.margin_tokens.min(window / 16))
                .saturating_sub(correction.overhead),
        );
        let budget_for = |previous: Option<&str>| {
            usable
                .saturating_sub(max_tokens)
                .saturating_sub(prompt::fixed_cost(encoding))
                .saturating_sub(previous.map_or(0, |p| encoding.count(p)))
        };
        let entries: Vec<String> = span
            .iter()
            .map(|&i| conversation.request.transcript(i))
            .collect();
        let instructions: Vec<&str> = [
            self.config.instructions.as_str(),
            conversation.context.instructions.as_deref().unwrap_or(""),
        ]
        .into_iter()
        .collect();
        // Chunks are sized for the largest summary the previous step could leave behind.
        let chunks = prompt::chunk_counted(
            entries,
            encoding,
            budget_for(previous).saturating_sub(max_tokens).max(256),
        );
        if chunks.len() > self.config.max_summary_chunks.max(1) {
            self.metrics
                .summaries_refused
                .get_or_create(&crate::metrics::ResultLabel {
                    result: "span_too_large",
                })
                .inc();
            return Err(SummaryError::SpanTooLarge);
        }
        let last_chunk = chunks.len().saturating_sub(1);
        let mut folded = 0;
        // The model sees and rewrites only its own text; the record is carried by code.
        let mut running = previous.map(|p| record::split(p).0.to_string());
        // The chunks of one span are each summarized alone and joined (`Carry::Append`, measured
        // best with a small model); a summary from before this span, an earlier checkpoint's or
        // the progress of a fold cut short, is given to the model with the first chunk to update.
        let chunk_style = prompt::Style::default();
        let update_style = prompt::Style {
            carry: prompt::Carry::Rewrite,
            ..chunk_style
        };
        for (n, (chunk, entries_in_chunk)) in chunks.into_iter().enumerate() {
            let style = if n == 0 { update_style } else { chunk_style };
            let user =
                prompt::user_prompt(style, running.as_deref(), &chunk, &instructions, max_tokens);
            let request = SummaryRequest {
                model,
                system: style.system_prompt(),
                user: &user,
                max_tokens,
                conversation: None,
            };
            self.metrics.summary_requests.inc();
            let answer = self
                .summarizer_for(conversation.request.dialect())
                .summarize(&request, &conversation.context.credentials)
                .await?;
            // The request's own markup, echoed by the model, is not stored.
            let answer = prompt::clean_answer(&answer);
            let text = style.fold(running.as_deref(), answer, encoding, max_tokens);
            folded += entries_in_chunk;
            if n < last_chunk {
                let progress = Progress {
                    folded,
                    text: &text,
                    encoding,
                    max_tokens: allowance,
                };
                self.store_progress(conversation, fold, progress).await;
            }
            running = Some(text);
        }
        let text = running.ok_or(SummaryError::Nothing)?;
        Ok(record::attach(&text, views, previous, encoding, allowance))
    }
}
