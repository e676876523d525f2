//! A hosted sandbox's code contexts: found, made on first use (`default`), listed, ended.

use std::sync::Arc;

use sandbase_api::code::{CreateCodeContextRequest, DEFAULT_CONTEXT};
use sandbase_api::internal::Exec;

use crate::agent_client::Refused;
use crate::background::Background;
use crate::code::{CodeContext, KERNEL, MAX_CONTEXTS};
use crate::error::NodeError;
use crate::exec::Hosted;

impl Hosted {
    /// Context `id`; `default` is made on first use (and again after it ended), another id
    /// must have been made.
    pub async fn code_context(&self, id: &str) -> Result<Arc<CodeContext>, NodeError> {
        let found = self.code_contexts.lock().await.get(id).cloned();
        match found {
            Some(context) if context.running() => Ok(context),
            _ if id == DEFAULT_CONTEXT => {
                self.make_code_context(DEFAULT_CONTEXT, &CreateCodeContextRequest::default())
                    .await
            }
            _ => {
                self.code_contexts.lock().await.remove(id);
                Err(NodeError::ContextNotFound)
            }
        }
    }

    /// Makes context `id` (replacing an ended one of that id).
    pub async fn make_code_context(
        &self,
        id: &str,
        request: &CreateCodeContextRequest,
    ) -> Result<Arc<CodeContext>, NodeError> {
        let mut contexts = self.code_contexts.lock().await;
        contexts.retain(|_, context| context.running());
        if let Some(context) = contexts.get(id) {
            return Ok(Arc::clone(context));
        }
        if contexts.len() >= MAX_CONTEXTS {
            return Err(NodeError::TooManyContexts(MAX_CONTEXTS));
        }
        let argv = ["python3", "-u", "-c", KERNEL].map(str::to_owned).to_vec();
        let exec = Exec {
            env: request.env.clone(),
            cwd: request.cwd.clone(),
            ..Exec::new(argv, request.user)
        };
        let started = self.start_kept(self.exec_request(&exec)?, None).await;
        let (pid, events, stdin) = match started {
            Ok(started) => started,
            Err(NodeError::Refused(Refused(refusal))) if refusal.kind == "not_found" => {
                return Err(NodeError::NoPython);
            }
            Err(other) => return Err(other),
        };
        let stdin = stdin.ok_or_else(|| NodeError::Internal(anyhow::anyhow!("no stdin")))?;
        let process = Arc::new(Background::new(
            pid,
            vec!["python3".to_owned(), format!("(code context {id})")],
            None,
            0,
            self.output_budget.clone(),
        ));
        self.lock_processes().insert(pid, Arc::clone(&process));
        let context = Arc::new(CodeContext::new(
            id.to_owned(),
            request.user,
            stdin,
            events,
            process,
        ));
        contexts.insert(id.to_owned(), Arc::clone(&context));
        Ok(context)
    }

    /// Its running contexts.
    pub async fn code_contexts(&self) -> Vec<Arc<CodeContext>> {
        let mut contexts = self.code_contexts.lock().await;
        contexts.retain(|_, context| context.running());
        let mut listed: Vec<_> = contexts.values().cloned().collect();
        listed.sort_by_key(|context| context.created_at);
        listed
    }

    /// Ends context `id`.
    pub async fn remove_code_context(&self, id: &str) -> Result<(), NodeError> {
        let removed = self.code_contexts.lock().await.remove(id);
        match removed {
            Some(context) => {
                context.end(&self.agent).await;
                Ok(())
            }
            None => Err(NodeError::ContextNotFound),
        }
    }
}
