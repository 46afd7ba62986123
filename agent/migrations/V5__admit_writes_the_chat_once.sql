-- Admission writes the chat's row once (issue 38's throughput): V3 upserted it to lock it (a
-- new row version even for a duplicate) and updated it again for a new turn. Now the row is
-- locked by SELECT … FOR UPDATE (created first when missing) and written only for a new turn.
-- Same arguments, same answers, same rule as `store::admission::decide`.
CREATE OR REPLACE FUNCTION admit_turn(
    p_chat text, p_id text, p_seq bigint, p_max_seq bigint, p_max_ahead bigint,
    p_attachments bigint, p_record jsonb, p_room text, p_thread text)
RETURNS TABLE (was_stored boolean, prior_last_seq bigint, inserted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_last   bigint;
    v_turns  bigint;
    v_before bigint;
BEGIN
    SELECT c.last_seq INTO v_last FROM chats c WHERE c.chat_id = p_chat FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO chats (chat_id) VALUES (p_chat) ON CONFLICT DO NOTHING;
        SELECT c.last_seq INTO v_last FROM chats c WHERE c.chat_id = p_chat FOR UPDATE;
    END IF;
    -- A new statement, a new snapshot: an admission of the same id that committed while this
    -- one waited for the lock is seen.
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
