// Scores a sales offer against the deal desk pricing policy.
// Pure: no clock, no randomness, no network. The same offer always gets the same answer.

export type Tier = 'strategic' | 'enterprise' | 'standard'

export interface Offer {
  discountPct: number
  marginPct: number
  termMonths: number
  dealSize: number
  tier: Tier
}

export interface OfferScore {
  score: number
  decision: 'approve' | 'review' | 'reject'
  reasons: string[]
}

export const POLICY = {
  // Largest discount each tier may get without a deal desk review.
  maxDiscountPct: { strategic: 25, enterprise: 15, standard: 10 },
  // Margin below this needs review; below the floor the offer is rejected.
  minMarginPct: 20,
  marginFloorPct: 10,
  // A discount this far past the allowance is rejected outright, not reviewed.
  hardDiscountOveragePct: 10,
  // Committing longer earns a larger discount allowance.
  termBonus: [
    { minMonths: 36, bonusPct: 5 },
    { minMonths: 24, bonusPct: 2 },
  ],
  // Terms shorter than this are reviewed: pricing is hard to hold for a few months.
  minTermMonths: 12,
  // Terms longer than this lock the price too long and are reviewed.
  maxTermMonths: 60,
  // Large deals earn a larger allowance; small deals get half of it.
  largeDealSize: 500_000,
  largeDealBonusPct: 5,
  smallDealSize: 10_000,
  // Below this score an otherwise acceptable offer still goes to review.
  approveMinScore: 70,
} as const

function round1(n: number): number {
  return Math.round(n * 10) / 10
}

/** The discount a tier may get for this term and deal size without review. */
export function discountAllowance(offer: Offer): number {
  let allowance: number = POLICY.maxDiscountPct[offer.tier]
  const bonus = POLICY.termBonus.find((b) => offer.termMonths >= b.minMonths)
  if (bonus) allowance += bonus.bonusPct
  if (offer.dealSize >= POLICY.largeDealSize) allowance += POLICY.largeDealBonusPct
  if (offer.dealSize < POLICY.smallDealSize) allowance /= 2
  return round1(allowance)
}

export function run(offer: Offer): OfferScore {
  const reasons: string[] = []
  let score = 100
  let reject = false
  let review = false

  const allowance = discountAllowance(offer)
  const overage = round1(offer.discountPct - allowance)
  if (overage > POLICY.hardDiscountOveragePct) {
    reject = true
    score -= 40 + 3 * overage
    reasons.push(
      `Discount ${offer.discountPct}% is ${overage} points over the ${allowance}% allowed for a ${offer.tier} deal of this size and term`,
    )
  } else if (overage > 0) {
    review = true
    score -= 15 + 3 * overage
    reasons.push(`Discount ${offer.discountPct}% exceeds the ${allowance}% allowance by ${overage} points`)
  } else {
    score -= allowance > 0 ? Math.round((offer.discountPct / allowance) * 15) : 0
    reasons.push(`Discount ${offer.discountPct}% is within the ${allowance}% allowance`)
  }

  if (offer.marginPct < POLICY.marginFloorPct) {
    reject = true
    score -= 40 + 2 * (POLICY.marginFloorPct - offer.marginPct)
    reasons.push(`Margin ${offer.marginPct}% is below the ${POLICY.marginFloorPct}% floor`)
  } else if (offer.marginPct < POLICY.minMarginPct) {
    review = true
    score -= 4 * (POLICY.minMarginPct - offer.marginPct)
    reasons.push(`Margin ${offer.marginPct}% is below the ${POLICY.minMarginPct}% minimum`)
  } else {
    reasons.push(`Margin ${offer.marginPct}% meets the ${POLICY.minMarginPct}% minimum`)
  }

  if (offer.termMonths < POLICY.minTermMonths) {
    review = true
    score -= 10
    reasons.push(`Term of ${offer.termMonths} months is shorter than ${POLICY.minTermMonths}`)
  } else if (offer.termMonths > POLICY.maxTermMonths) {
    review = true
    score -= 10
    reasons.push(`Term of ${offer.termMonths} months locks pricing past ${POLICY.maxTermMonths}`)
  }

  if (offer.dealSize >= POLICY.largeDealSize) {
    reasons.push(`Deal size ${offer.dealSize} earns the large-deal allowance`)
  } else if (offer.dealSize < POLICY.smallDealSize) {
    reasons.push(`Deal size ${offer.dealSize} is small: the discount allowance is halved`)
  }

  score = Math.max(0, Math.min(100, Math.round(score)))
  if (!reject && !review && score < POLICY.approveMinScore) {
    review = true
    reasons.push(`Score ${score} is below ${POLICY.approveMinScore}`)
  }
  const decision = reject ? 'reject' : review ? 'review' : 'approve'
  return { score, decision, reasons }
}
