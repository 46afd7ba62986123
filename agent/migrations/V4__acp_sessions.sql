-- The Agent Client Protocol brain's session per chat (AGENT_BRAIN=acp): the next turn, on any
-- agent, resumes it with session/load.
CREATE TABLE acp_sessions (
    chat_id    TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
