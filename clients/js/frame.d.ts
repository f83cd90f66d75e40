// Types of frame.js ('@runnerd/app-sdk/frame'): the SDK of an app's frame alone.
import type { FrameClient, ToolMap } from './index.js';

export { AppBridgeError } from './index.js';
export type { FrameClient, FrameRunOptions, FrameRunResult, ToolInfo, ToolMap } from './index.js';

/** The version of the message protocol: every message carries `runnerd: 1`. */
export declare const BRIDGE_VERSION: 1;

/** The client of the frame this page runs in (`window`, unless a test gives another). */
export declare function getAppClient<Tools extends ToolMap = ToolMap>(
  options?: { window?: Window },
): FrameClient<Tools>;
