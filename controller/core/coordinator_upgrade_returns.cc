// UpgradePart: the primary's returns of blocks, taken as the answers to a Reclaim (the
// canary's share, or the promotion reserve's refill) or as blocks it gave up of its own.
#include "controller/core/coordinator_parts.h"

namespace baton {

void UpgradePart::OnPrimaryReturned() {
  // A return says not whether it answers a Reclaim: blocks the primary gave up of its own
  // accord may come first and be taken for the answer, however many they are. So every
  // later one within the Reclaim's time is taken as its answer too (the answer may come
  // after several returns of the engine's own): at worst blocks it gave up are granted back
  // to it, rather than the answer's blocks left free for nobody.
  const bool pending = s_.reclaim.from == s_.primary;
  const bool late = !pending && LateReclaimAnswer();
  const bool answers_reclaim = pending || late;
  // The answer to RefillReserve's Reclaim: the reserve keeps what came back.
  const bool for_reserve = pending ? s_.reclaim.for_reserve : late && own_.late_answer_for_reserve;
  if (pending) {
    own_.late_answer_from = s_.primary;
    own_.late_answer_until = s_.reclaim.sent + CoordinatorState::kReclaimAnswerTimeout;
    own_.late_answer_for_reserve = s_.reclaim.for_reserve;
    s_.reclaim = PendingReclaim{};
  }
  if (s_.stopping) return;
  if (for_reserve) {
    // Blocks freed while the Reclaim was out (a canary's, rolled back) may have filled the
    // reserve first: what came back beyond it returns to the primary, or it stays free.
    if (!own_.upgrade.has_value() && s_.ledger->GrantableTo(s_.primary) > 0) {
      own_.give_back_blocks = true;
      GiveFreeBlocksToPrimary();
    }
    return;
  }
  if (!own_.upgrade.has_value()) {
    // The answer to a Reclaim came after the upgrade ended: nobody else wants the blocks.
    if (answers_reclaim) {
      own_.give_back_blocks = true;
      GiveFreeBlocksToPrimary();
    }
    return;
  }
  if (own_.upgrade->phase == Upgrade::Phase::kReclaiming) {
    PromoteCanary();  // may end the upgrade
  } else if (own_.upgrade->phase == Upgrade::Phase::kCanary) {
    GrantFreeToCanary();
  }
  // Blocks it returned of chunks it keeps can go to no other engine: they go back (only for
  // an answer to a Reclaim: blocks an engine gives up of its own accord stay free).
  EngineRecord* p = s_.Find(s_.primary);
  const uint32_t kept = answers_reclaim ? s_.ledger->FreeBesideHeld(s_.primary) : 0;
  if (p != nullptr && p->serving() && kept > 0) {
    p_.engines->GrantFree(*p, kept, "the primary (its own chunks)");
  }
}

// Only while no other Reclaim is out and no upgrade runs: an upgrade's Reclaim is answered
// for the canary.
bool UpgradePart::LateReclaimAnswer() const {
  return own_.late_answer_from != kNoEngine && own_.late_answer_from == s_.primary &&
         s_.reclaim.from == kNoEngine && !own_.upgrade.has_value() &&
         s_.clock.Now() < own_.late_answer_until;
}

}  // namespace baton
