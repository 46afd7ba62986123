//! The file log as a [`ChatRecord`]: admission decided against the in-memory index and the
//! log, under the chat's lock (one agent process owns a state directory).

use std::collections::BTreeMap;

use protocol::{UserMessage, WorkspacePath};

use super::admission::{Admission, decide, warn_out_of_line};
use super::record::{Begun, ChatRecord};
use super::{ChatLog, Perceived, Step, StoreError, TurnEnd, TurnRecord};

impl ChatRecord for ChatLog {
    async fn admit(&mut self, msg: &UserMessage) -> Result<Admission, StoreError> {
        let stored = self.contains(&msg.id).await?;
        let admission = decide(stored, msg.seq, self.last_seq);
        if admission != Admission::New {
            return Ok(admission);
        }
        warn_out_of_line(msg.seq, self.last_seq);
        self.append_turn(msg).await?;
        self.last_seq = self.last_seq.max(msg.seq);
        Ok(Admission::New)
    }

    async fn last_seq(&mut self) -> Result<u64, StoreError> {
        Ok(self.last_seq)
    }

    async fn pending(&mut self) -> Result<Vec<String>, StoreError> {
        Ok(ChatLog::pending(self))
    }

    async fn begin(&mut self, id: &str) -> Result<Option<Begun>, StoreError> {
        let room_id = self.room_id().map(str::to_owned);
        let Some((turn, history)) = ChatLog::begin(self, id).await? else {
            return Ok(None);
        };
        let steps = ChatLog::steps(self, id).await?;
        Ok(Some(Begun {
            turn,
            history,
            room_id,
            steps,
        }))
    }

    async fn turn(&mut self, id: &str) -> Result<Option<TurnRecord>, StoreError> {
        ChatLog::turn(self, id).await
    }

    async fn finish(&mut self, end: TurnEnd) -> Result<(), StoreError> {
        ChatLog::finish(self, end).await
    }

    async fn perceive(
        &mut self,
        id: &str,
        perceived: BTreeMap<WorkspacePath, Perceived>,
    ) -> Result<(), StoreError> {
        ChatLog::perceive(self, id, perceived).await
    }

    async fn is_always_allowed(
        &mut self,
        user: &str,
        key: &(String, String),
    ) -> Result<bool, StoreError> {
        Ok(ChatLog::is_always_allowed(self, user, key))
    }

    async fn allow_always(&mut self, user: &str, key: (String, String)) -> Result<(), StoreError> {
        ChatLog::allow_always(self, user, key).await
    }

    async fn steps(&mut self, id: &str) -> Result<Vec<Step>, StoreError> {
        ChatLog::steps(self, id).await
    }

    async fn record_step(&mut self, id: &str, n: u32, step: &Step) -> Result<(), StoreError> {
        ChatLog::record_step(self, id, n, step).await
    }
}
