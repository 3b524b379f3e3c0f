// Package payment is paystream's payment state machine: pure, deterministic and
// free of I/O. Given a payment's current State and one normalized Fact from a
// gateway, Machine.Apply decides whether the fact is a real change (a
// Transition, with the ledger postings it implies) or is ignored or deferred,
// so that any permutation and duplication of a payment's facts converges to the
// same state and the same ledger balances.
//
// # How it converges
//
// A State is made of parts that only grow: the lifecycle status (by rank),
// the captured amount, the set of refunds, and the dispute (by rank). A fact
// is applied when it adds to one of them, ignored when the state already
// holds what it says, and deferred when it needs a part that is not there yet
// (a refund needs the capture). Growth does not depend on the order facts
// come in, Status is computed from the parts, and each transition's postings
// are the difference between the ledger balances State.Balances gives before
// and after it. So the same facts give an Equivalent state and the same
// balances in any order, provided deferred facts are offered again after
// every transition: Machine.Resume, Machine.Offer and Machine.Replay do that,
// and the property tests replay random histories in random orders through
// them.
//
// Thin payloads are fine: a status fact without amount or currency still
// moves the status, and if a later fact that is otherwise a duplicate or
// stale carries the amount or currency the state lacks, it is applied as a
// KindDetails transition, so the state does not depend on whether the thin
// fact came first. Money never moves on a guessed amount: a paid fact, a
// partial refund or a dispute without amount waits (ReasonAmountUnknown) for
// a fact that has it or for a refetch.
//
// Convergence assumes the facts describe one real history: facts about the
// same status or refund agree on its amount, and the payment has one
// currency. Facts that disagree are not lost silently: they are ignored with
// ReasonAmountMismatch, ReasonRefundExceedsPaid or ReasonCurrencyMismatch, and
// which of two disagreeing facts wins depends on which came first.
//
// # States
//
// Before money moves, the lifecycle. Any status may be the first one seen
// (gateways do not always send "created"), and a fact may skip ahead:
//
//	(new) --> pending --> authorized -------------------------> paid
//	             |          |       |                       ^  ^
//	             |          v       v                       |  |
//	             +------> failed -> canceled ---------------+  |
//	             |          |          ^    (boleto paid late) |
//	             +----------|----------+                       |
//	                        +----------------------------------+
//	                                     (a retry succeeds)
//
// The lifecycle only moves up its rank: pending < authorized < failed <
// canceled < paid. Failed and canceled are terminal for a payment that never
// gets paid, but a paid fact after them (a retried attempt, a boleto paid
// after it was canceled) is applied: money that arrived is never ignored. A
// failed or canceled fact after paid is stale, so both orders end in paid.
// Authorized after failed (a retry that was only authorized) is stale: the
// payment shows failed until it is paid or canceled.
//
// Once paid, refunds and disputes combine freely:
//
//	paid --refund--> partially_refunded --refund--> refunded
//	  |                                   (or one refunded fact without amount)
//	  |
//	  +--dispute--> disputed --won--> dispute_won --lost--> dispute_lost
//	                    |             (arbitration)              ^
//	                    +-------------------lost-----------------+
//
// # Status
//
// A paid payment's Status is computed, in this precedence: an open dispute is
// disputed; a lost dispute is dispute_lost; refunds adding up to the capture
// make it refunded, less than it partially_refunded; a won dispute is
// dispute_won; otherwise paid. Before paid, Status is the lifecycle status.
//
// # Rules
//
// Checked first, for every fact: a malformed fact (unknown status, amount
// negative or above MaxAmountMinor, currency not three upper-case letters) is
// ignored, ReasonInvalidFact; a currency other than the payment's is ignored,
// ReasonCurrencyMismatch. An empty currency means "the payment's".
//
//	fact                       payment                          decision
//	-------------------------  -------------------------------  ------------------------------
//	pending, authorized,       lifecycle ranks below the fact   applied: status (paid: capture)
//	failed, canceled, paid     lifecycle at or above the fact   ignored: duplicate_fact if in
//	                                                            that status, else stale
//	  ... carrying the amount  lifecycle at or above the fact,  applied: details (no status
//	  or currency              state lacks amount or currency   change, no money)
//	paid                       already paid, other amount       ignored: amount_mismatch
//	paid without amount        not yet paid                     deferred: amount_unknown
//	  (or no currency known)
//	refunded/partially_refun-  not paid                         deferred: needs_predecessor
//	ded with RefundID and      id new, fits in the capture      applied: refund
//	amount                     id known, same amount            ignored: duplicate_fact
//	                           id known, other amount           ignored: amount_mismatch
//	                           known refunds + amount > capture ignored: refund_exceeds_captured
//	refunded without RefundID  not paid                         deferred: needs_predecessor
//	  (id FullRefundID), or    not yet refunded in full         applied: refund of the remainder
//	  with RefundID, no amount already refunded in full         ignored: duplicate_fact
//	partially_refunded with    id new                           deferred: amount_unknown
//	RefundID, no amount        id known                         ignored: duplicate_fact
//	partially_refunded         no refund yet                    deferred: missing_refund_id
//	without RefundID           some refund applied              ignored: duplicate_fact
//	disputed                   not paid                         deferred: needs_predecessor
//	                           no dispute yet, no amount        deferred: amount_unknown
//	                           no dispute yet                   applied: dispute (amount capped
//	                                                            at the capture)
//	                           dispute already opened           ignored: duplicate_fact/stale
//	dispute_won                no dispute yet                   deferred: needs_predecessor
//	                           dispute open                     applied: dispute_won
//	                           won or lost                      ignored: duplicate_fact/stale
//	dispute_lost               no dispute yet                   deferred: needs_predecessor
//	                           dispute open or won              applied: dispute_lost
//	                           lost                             ignored: duplicate_fact
//
// Refunds are additive: each RefundID is applied once, whatever its
// timestamp; a refund fact is never stale, one already held is a duplicate.
// A refunded fact without amount says the payment is refunded in full (its
// AmountMinor is not read when RefundID is empty, as drivers often put the
// payment's amount there). It refunds whatever the refunds with known
// amounts do not cover, and sets State.FullRefund. Refunds with amounts that
// arrive after it move no money (they are already covered): they are
// recorded as KindRefundIdentified transitions without postings. Once the
// refunds with known amounts add up to the capture, the full refund has
// nothing left to explain and is dropped from the state, so the state is the
// same whether it came first or last. An over-refund is ignored, not
// deferred: refunds only grow, so it could never become valid, and a
// consistent history never has one.
//
// Disputes move the disputed amount from the merchant into the dispute
// reserve; winning moves it back, losing sends it out through the gateway
// (see package ledger's chart of accounts). One dispute per payment; the
// amounts on dispute_won and dispute_lost facts are not read. Refunds and
// disputes are independent: a payment may be both refunded and charged back,
// and the ledger then shows the merchant owing the difference.
//
// A deferred fact waits (in the processor, as a deferred inbox row) and is
// offered again after each transition of its payment, oldest OccurredAt
// first; if nothing resolves it within a window, the payment is refetched
// from the gateway or surfaced for review.
//
// # Versions and events
//
// Each applied fact makes exactly one Transition, whose Version is one above
// the state's: a payment's transitions are gapless from 1 and never regress,
// and each one's From is the previous one's To. Different delivery orders can
// make different intermediate transitions (in-order pending, authorized, paid
// makes three; paid first makes one, then pending and authorized are stale),
// so Version and LastEventAt are the only fields that depend on order; State.
// Equivalent compares the rest.
package payment
