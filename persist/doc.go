// Package persist owns where messages live and the tables beside them:
//
//   - Store, over the memory (embedded default) and PostgreSQL
//     implementations: CommitBatch takes a batch of Rows (room key,
//     sender, idempotency key, body) as one unit of work and answers each
//     Row's Stored (seq, commit time, duplicate, error); Head, Range and
//     History read them back. Per room, seqs are consecutive in commit
//     order, and a (room, sender, id) is stored once.
//   - Retention (what a room keeps, by age and count, per app).
//   - The app registry's tables, or its JSON file (apps.go, appfile.go).
//   - The webhook cursors and dead letters (webhook.go).
//
// It knows neither wire frames nor who publishes: fanout gathers the
// publishes into batches, commits them here, and encodes what comes back.
//
// persist imports only proto; main wires it to fanout.
package persist
