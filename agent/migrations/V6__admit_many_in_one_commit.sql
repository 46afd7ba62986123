-- Admissions of several chats in one call and one commit (issue 38's throughput: group commit,
-- `store::group`). Each element is admitted by `admit_turn` (V5) with the same answers; the
-- elements are taken in the order of their chat, then of their place in the arrays, so two
-- agents' batches lock chats' rows in one order and never deadlock, and two messages of one
-- chat keep the order they were given in. `k` is the element's place (from 1).
CREATE FUNCTION admit_turns(
    p_chat text[], p_id text[], p_seq bigint[], p_max_seq bigint, p_max_ahead bigint,
    p_attachments bigint[], p_record jsonb[], p_room text[], p_thread text[])
RETURNS TABLE (k bigint, was_stored boolean, prior_last_seq bigint, inserted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT b.chat, b.id, b.seq, b.attachments, b.record, b.room, b.thread, b.k
        FROM unnest(p_chat, p_id, p_seq, p_attachments, p_record, p_room, p_thread)
            WITH ORDINALITY AS b(chat, id, seq, attachments, record, room, thread, k)
        ORDER BY b.chat COLLATE "C", b.k
    LOOP
        RETURN QUERY SELECT r.k, a.was_stored, a.prior_last_seq, a.inserted
            FROM admit_turn(r.chat, r.id, r.seq, p_max_seq, p_max_ahead, r.attachments,
                            r.record, r.room, r.thread) AS a;
    END LOOP;
END
$$;
