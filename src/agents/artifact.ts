import type { StepContext } from '../steps/context.js';
import type { Execution } from '../engine/run/execution.js';

/** An artifact's content (text or bytes, stored once by sha256), or a reference to where it lives. */
export type ArtifactContent = string | Uint8Array | { ref: string; sha256?: string; size?: number };

export interface ArtifactRecord {
  artifactId: string;
  name: string;
  sha256: string;
  size: number;
  ref: string | null;
}

export function recordArtifact(_ctx: StepContext, _exec: Execution, _name: string, _content: ArtifactContent): Promise<ArtifactRecord> {
  throw new Error('artifacts: not built yet');
}
