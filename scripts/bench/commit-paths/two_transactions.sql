-- (a) reservation committed first, then business write + completion in one transaction; 3 commits.
\set k random(1, 9000000000000000)
INSERT INTO idempotency_operations AS o (scope, idempotency_key, operation_id, fingerprint, method, route, state, lease_id, lease_expires_at, attempts, retention, unknown_retention, created_at, expires_at) VALUES ('bench', :k::text, gen_random_uuid(), 'sha256:5e1c', 'POST', '/v1/tickets', 'in_progress', '00000000-0000-4000-8000-000000000001', now() + interval '60 seconds', 1, interval '24 hours', interval '7 days', now(), now() + interval '7 days 60 seconds') ON CONFLICT (scope, idempotency_key) DO UPDATE SET replays = o.replays + 1 RETURNING operation_id, state, lease_id, now();
BEGIN;
INSERT INTO tickets (account, id, title, source_event_id) VALUES ('bench', gen_random_uuid(), 'Rotate the TLS certificate', :k::text);
UPDATE idempotency_operations AS o SET state = 'completed', response_status = 201, response_header_names = ARRAY['content-type'], response_header_values = ARRAY[convert_to('application/json', 'UTF8')], response_body = convert_to(repeat('x', 300), 'UTF8'), completed_at = now(), expires_at = now() + o.retention, lease_id = NULL, lease_expires_at = NULL WHERE o.scope = 'bench' AND o.idempotency_key = :k::text AND o.lease_id = '00000000-0000-4000-8000-000000000001' AND o.state <> 'completed' RETURNING o.operation_id;
COMMIT;
UPDATE idempotency_operations AS o SET delivered = true WHERE o.scope = 'bench' AND o.idempotency_key = :k::text AND o.state = 'completed' AND NOT o.delivered;
