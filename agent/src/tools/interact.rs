//! Tools that involve the user: `ask_user` and `dangerous_action` (the approvals demo).

use schemars::JsonSchema;
use serde::Deserialize;

use super::{Tool, ToolCx, ToolError, ToolOutput};
use crate::confine::ChatScope;

/// Ask the user a question and wait for the answer.
#[derive(Debug)]
pub struct AskUserTool;

/// Arguments of `ask_user`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskUserArgs {
    /// The question.
    pub question: String,
    /// Suggested answers.
    #[serde(default)]
    pub options: Vec<String>,
}

impl Tool for AskUserTool {
    const NAME: &'static str = "ask_user";
    const DESCRIPTION: &'static str = "Ask the user a question and wait for the answer.";
    type Args = AskUserArgs;

    fn resource(args: &Self::Args, _: &ChatScope) -> String {
        args.question.clone()
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        let answer = cx
            .link
            .ask(cx.turn, &args.question, args.options)
            .await
            .map_err(|_| ToolError::Disconnected)?;
        Ok(answer.unwrap_or_else(|| "no reply".to_owned()).into())
    }
}

/// A stand-in for an action with consequences; its default policy is `ask`.
#[derive(Debug)]
pub struct DangerousAction;

/// Arguments of `dangerous_action`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DangerousActionArgs {
    /// What to do.
    pub action: String,
}

impl Tool for DangerousAction {
    const NAME: &'static str = "dangerous_action";
    const DEMO: bool = true;
    const DESCRIPTION: &'static str =
        "Perform an action that needs the user's approval (a simulation: nothing is changed).";
    type Args = DangerousActionArgs;

    fn resource(args: &Self::Args, _: &ChatScope) -> String {
        args.action.clone()
    }

    fn summary(args: &Self::Args, _: &ChatScope) -> String {
        format!("The agent wants to perform: {}", args.action)
    }

    async fn call(args: Self::Args, _: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        Ok(format!("performed (simulated): {}", args.action).into())
    }
}
