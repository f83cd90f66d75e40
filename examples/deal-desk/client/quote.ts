// An app that asks the deal desk whether to approve an offer, through the runnerd app SDK.
// `runnerd tools types --lang ts --app deal-desk > runnerd-tools.ts` makes the types that
// check `score_offer`'s input and output here at compile time (tsc --noEmit).
import { AppBridgeError, getAppClient } from '@runnerd/app-sdk';
import type { RunnerdTools, ScoreOfferInput } from './runnerd-tools';

const client = getAppClient<RunnerdTools>({
  url: process.env.RUNNERD_URL ?? 'http://127.0.0.1:8686',
  apiKey: process.env.RUNNERD_API_KEY ?? '',
  workspaceId: process.env.RUNNERD_WORKSPACE ?? '',
  app: 'deal-desk',
});

export async function quote(offer: ScoreOfferInput): Promise<string> {
  try {
    const run = await client.runTool('score_offer', offer);
    if (run.status !== 'succeeded' || run.output === null) {
      return `the deal desk could not score it: ${run.error}`;
    }
    const { decision, score, reasons } = run.output;
    return `${decision} (${score}/100): ${reasons.join('; ')}`;
  } catch (err) {
    if (err instanceof AppBridgeError && err.reason === 'budget_exhausted') {
      return 'the deal desk is out of budget this month';
    }
    throw err;
  }
}

console.log(await quote({ discountPct: 12, marginPct: 30, termMonths: 24, dealSize: 120000, tier: 'enterprise' }));
