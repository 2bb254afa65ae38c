//! How an exchange reads its body: parsed once in the target's dialect, the compaction blocks
//! and items Compactor minted expanded, the compaction a client asks for answered (or served at
//! its threshold), and a request that relies on history the provider holds told apart, to be
//! forwarded as it came.

use bytes::Bytes;

use super::super::client_compaction::{self, Intercepted};
use super::super::error::ApiError;
use super::super::limits::check_model_name;
use super::super::messages_compaction;
use super::super::threshold_compaction::{self, AtThreshold};
use super::{Exchange, Parsed};
use crate::dialect::responses::request::ResponsesRequest;
use crate::dialect::WireRequest;

impl Exchange<'_> {
    /// Parses the body once in the target's dialect. Where the target emulates client
    /// compaction, the compaction items Compactor minted are expanded in the parsed request
    /// and, with `answer_trigger`, an input ending in a compaction trigger is answered. A model
    /// name beyond its bound is refused here, before the request is counted or forwarded.
    ///
    /// The calls that can write a summary are boxed: their state is many times that of a plain
    /// parse, and every request's future would otherwise be as large (held for as long as the
    /// connection and moved whole when it is boxed).
    pub(super) async fn parse(
        &self,
        bytes: Bytes,
        answer_trigger: bool,
    ) -> Result<Parsed, ApiError> {
        if self.target.context_edits {
            let read = Box::pin(messages_compaction::read(
                self.app,
                self.tenant,
                self.headers,
                &bytes,
                answer_trigger,
            ))
            .await?;
            return Ok(match read {
                messages_compaction::Read::Request(request, expanded, at_threshold) => {
                    Parsed::Request(request, expanded, at_threshold)
                }
                messages_compaction::Read::Answered(response) => Parsed::Answered(response),
            });
        }
        if !self.target.client_compaction {
            let parsed = self.target.dialect.parse(&bytes);
            return Ok(
                match self.server_state(parsed, |r| r.uses_server_state(), &bytes)? {
                    Ok(request) => {
                        check_model_name(request.model())?;
                        Parsed::Request(request, None, AtThreshold::Under)
                    }
                    Err(bytes) => Parsed::ServerState(bytes),
                },
            );
        }
        let mut request = match ResponsesRequest::parse_shared(&bytes) {
            Ok(request) => request,
            Err(e) => {
                let holds = self.target.holds_server_state;
                if holds.is_some_and(|holds| holds(&bytes))
                    && !client_compaction::carries_minted_item(&bytes)
                {
                    return Ok(Parsed::ServerState(bytes));
                }
                return Err(e.into());
            }
        };
        if request.uses_server_state() {
            // Forwarded as it came, except for the items Compactor minted: those are expanded,
            // never sent to the provider.
            if Box::pin(client_compaction::expand(
                self.app,
                self.tenant,
                &mut request,
            ))
            .await?
            .is_some()
            {
                return Ok(Parsed::ServerState(request.original_body()));
            }
            return Ok(Parsed::ServerState(bytes));
        }
        check_model_name(request.model())?;
        let last_minted = request.minted_compactions().last().map(|(index, _)| *index);
        let intercepted =
            Box::pin(client_compaction::intercept(self.app, self.tenant, request)).await?;
        Ok(match intercepted {
            Intercepted::Trigger(request) if answer_trigger => Parsed::Answered(
                Box::pin(client_compaction::answer_trigger(
                    self.app,
                    self.tenant,
                    self.headers,
                    request,
                ))
                .await?,
            ),
            Intercepted::Trigger(mut request) => {
                request.remove_context_management();
                Parsed::Request(Box::new(request), None, AtThreshold::Under)
            }
            Intercepted::Forward(mut request, expanded) if answer_trigger => {
                let at_threshold = Box::pin(threshold_compaction::serve(
                    self.app,
                    self.tenant,
                    self.headers,
                    &mut request,
                    last_minted,
                ))
                .await?;
                Parsed::Request(Box::new(request), expanded, at_threshold)
            }
            Intercepted::Forward(mut request, expanded) => {
                request.compact_threshold()?;
                request.remove_context_management();
                Parsed::Request(Box::new(request), expanded, AtThreshold::Under)
            }
        })
    }

    /// A parsed request, or the body back (`Err`) when it relies on history the provider holds;
    /// a body that does not parse is still forwarded if the target can tell it does.
    fn server_state<R>(
        &self,
        parsed: Result<R, crate::dialect::RequestError>,
        uses_server_state: impl Fn(&R) -> bool,
        bytes: &Bytes,
    ) -> Result<Result<R, Bytes>, ApiError> {
        match parsed {
            Ok(request) if uses_server_state(&request) => Ok(Err(bytes.clone())),
            Ok(request) => Ok(Ok(request)),
            Err(_)
                if self
                    .target
                    .holds_server_state
                    .is_some_and(|holds| holds(bytes)) =>
            {
                Ok(Err(bytes.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }
}
