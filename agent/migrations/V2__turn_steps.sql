-- Completed steps of running turns (model responses, tool calls with their outcomes), so a turn
-- picked up by another agent resumes after them (issue 38). Deleted when the turn ends.
CREATE TABLE turn_steps (
    chat_id text    NOT NULL,
    turn_id text    NOT NULL,
    n       integer NOT NULL,
    step    jsonb   NOT NULL,
    PRIMARY KEY (chat_id, turn_id, n),
    FOREIGN KEY (chat_id, turn_id) REFERENCES turns (chat_id, id) ON DELETE CASCADE
);
