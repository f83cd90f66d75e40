// The one Node global this example uses (so the type check needs no @types/node).
declare const process: { env: Record<string, string | undefined> };
