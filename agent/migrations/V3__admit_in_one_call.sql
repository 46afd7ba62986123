-- Admission of a message in one round trip (issue 38's admission latency): the chat's row is
-- created if needed and locked, the message id looked up, and the turn stored when it is new and
-- its seq plausible, inside one call. Each statement of a plpgsql function takes a new snapshot
-- under READ COMMITTED, so the look-up sees an admission of the same id that committed while this
-- one waited for the lock.
--
-- The agent decides the admission itself from (was_stored, prior_last_seq), with the same rule
-- (`store::admission::decide`); `p_max_seq` and `p_max_ahead` are its bounds, so the function
-- stores exactly when that rule says "new", and `inserted` lets the agent check it did.
CREATE FUNCTION admit_turn(
    p_chat text, p_id text, p_seq bigint, p_max_seq bigint, p_max_ahead bigint,
    p_attachments bigint, p_record jsonb, p_room text, p_thread text)
RETURNS TABLE (was_stored boolean, prior_last_seq bigint, inserted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_last   bigint;
    v_turns  bigint;
    v_before bigint;
BEGIN
    INSERT INTO chats AS c (chat_id) VALUES (p_chat)
        ON CONFLICT (chat_id) DO UPDATE SET last_seq = c.last_seq
        RETURNING c.last_seq INTO v_last;
    IF EXISTS (SELECT 1 FROM turns t WHERE t.chat_id = p_chat AND t.id = p_id) THEN
        RETURN QUERY SELECT true, v_last, false;
        RETURN;
    END IF;
    IF p_seq < 1 OR p_seq > p_max_seq OR p_seq > v_last + p_max_ahead THEN
        RETURN QUERY SELECT false, v_last, false;
        RETURN;
    END IF;
    UPDATE chats AS c SET room_id = COALESCE(c.room_id, p_room),
        thread_root = COALESCE(c.thread_root, p_thread),
        last_seq = GREATEST(c.last_seq, p_seq),
        turns = c.turns + 1, attachments = c.attachments + p_attachments
        WHERE c.chat_id = p_chat
        RETURNING c.turns, c.attachments - p_attachments INTO v_turns, v_before;
    INSERT INTO turns (chat_id, n, id, seq, status, attachments, attachments_before, record)
        VALUES (p_chat, v_turns, p_id, p_seq, 'pending', p_attachments, v_before, p_record);
    RETURN QUERY SELECT false, v_last, true;
END
$$;
