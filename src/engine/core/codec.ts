import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { ConfigError, PayloadKeyMissingError, PayloadUnreadableError } from './errors.js';

/** A JSON value: what a codec takes and gives back, and what PostgreSQL stores as jsonb. */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/**
 * Turns every user payload into what is stored (`encode`) and back (`decode`):
 * `createEngine({ codec })`. The engine calls `encode` with the payload's JSON form
 * (after its own JSON checks) just before it is written, and `decode` with what it reads
 * back, before anyone sees it.
 *
 * Both are synchronous, deliberately: node:crypto's AES-GCM is synchronous and takes
 * microseconds per kilobyte, and the engine decodes in places that are synchronous
 * today (replaying a checkpoint returns its value in the same turn, a step's result is
 * encoded as it is checked). An async codec would add an await, a microtask hop and an
 * error path to every checkpoint write and replay. A codec whose keys live in a KMS
 * unwraps its data keys once, before createEngine, and encrypts with them synchronously.
 *
 * `decode` must return a value that it did not encode unchanged (a row written before the
 * codec was enabled, a signal sent from psql in clear): that is how old rows keep reading.
 * It throws a RunledgerError (PAYLOAD_KEY_MISSING, PAYLOAD_UNREADABLE) for what it cannot
 * read; anything else it throws is reported as PAYLOAD_UNREADABLE.
 */
export interface PayloadCodec {
  encode(value: JsonValue): JsonValue;
  decode(stored: JsonValue): JsonValue;
}

/** What aesGcmCodec stores in place of a payload: the key id, the nonce, the tag and the ciphertext, base64. */
export interface AesGcmEnvelope {
  $enc: string;
  iv: string;
  tag: string;
  data: string;
}

export interface AesGcmCodecOptions {
  /** Keys by id: 32 bytes each, as a Buffer (or Uint8Array) or a base64 string. Old keys stay here for as long as rows use them. */
  keys: Record<string, Uint8Array | string>;
  /** The id of the key new payloads are encrypted with. */
  activeKey: string;
}

/**
 * The engine's fast path into a codec that encrypts JSON text itself: aesGcmCodec
 * encrypts a step's result from the JSON text the engine made of it anyway, and gives the
 * envelope's JSON text, instead of serialising the value and then the envelope again.
 * Not part of the public interface.
 */
export const ENCODE_JSON_TEXT: unique symbol = Symbol('runledger.encodeJsonText');

export interface JsonTextEncoder {
  /** The stored JSON text for a payload's JSON text. */
  [ENCODE_JSON_TEXT](jsonText: string): string;
}

const KEY_ID = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/;
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;
const KEY_BYTES = 32;
const IV_BYTES = 12;
const TAG_BYTES = 16;
const ENVELOPE_KEYS = ['$enc', 'iv', 'tag', 'data'];

/** True for exactly `{ $enc, iv, tag, data }`, all strings: what aesGcmCodec writes, and nothing a user value is likely to be. */
export function isAesGcmEnvelope(value: unknown): value is AesGcmEnvelope {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const keys = Object.keys(value);
  if (keys.length !== ENVELOPE_KEYS.length || !ENVELOPE_KEYS.every((k) => keys.includes(k))) return false;
  const v = value as Record<string, unknown>;
  return ENVELOPE_KEYS.every((k) => typeof v[k] === 'string');
}

function keyBytes(id: string, key: unknown): Buffer {
  let bytes: Buffer;
  if (typeof key === 'string') {
    if (!BASE64.test(key) || key.length % 4 !== 0) throw new ConfigError(`aesGcmCodec: key ${id} is a string but not base64`);
    bytes = Buffer.from(key, 'base64');
  } else if (key instanceof Uint8Array) {
    bytes = Buffer.from(key);
  } else {
    throw new ConfigError(`aesGcmCodec: key ${id} must be a Buffer or a base64 string of ${KEY_BYTES} bytes`);
  }
  if (bytes.length !== KEY_BYTES) {
    throw new ConfigError(`aesGcmCodec: key ${id} is ${bytes.length} bytes; AES-256-GCM takes ${KEY_BYTES} (openssl rand -base64 32)`);
  }
  return bytes;
}

/**
 * AES-256-GCM (node:crypto) with a random 12-byte nonce per payload. A payload is stored
 * as `{"$enc": "<key id>", "iv": "...", "tag": "...", "data": "..."}` (base64): the
 * encryption of its JSON text under the active key. Decode picks the key the envelope
 * names, so keys rotate without rewriting old rows (docs/security.md); a key it does not
 * have is PAYLOAD_KEY_MISSING, naming it; a tag that does not verify is PAYLOAD_UNREADABLE.
 * A value that is not an envelope is returned as it is. Bad keys are CONFIG errors here.
 */
export function aesGcmCodec(options: AesGcmCodecOptions): PayloadCodec {
  const given = options?.keys;
  if (typeof given !== 'object' || given === null || Array.isArray(given) || Object.keys(given).length === 0) {
    throw new ConfigError('aesGcmCodec: keys must be an object of { keyId: key } with at least one key');
  }
  const keys = new Map<string, Buffer>();
  for (const [id, key] of Object.entries(given)) {
    if (!KEY_ID.test(id)) {
      throw new ConfigError(`aesGcmCodec: key id ${JSON.stringify(id)} is invalid: 1-64 characters of letters, digits, '_', '.', ':', '-'`);
    }
    keys.set(id, keyBytes(id, key));
  }
  const activeId = options.activeKey;
  const active = typeof activeId === 'string' ? keys.get(activeId) : undefined;
  if (!active) {
    throw new ConfigError(`aesGcmCodec: activeKey ${JSON.stringify(activeId)} is not one of the keys (${[...keys.keys()].join(', ')})`);
  }

  const encrypt = (jsonText: string): AesGcmEnvelope => {
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv('aes-256-gcm', active, iv);
    const data = Buffer.concat([cipher.update(jsonText, 'utf8'), cipher.final()]);
    return { $enc: activeId, iv: iv.toString('base64'), tag: cipher.getAuthTag().toString('base64'), data: data.toString('base64') };
  };

  const idJson = JSON.stringify(activeId);
  const codec: PayloadCodec & JsonTextEncoder = {
    encode: (value) => encrypt(JSON.stringify(value)) as unknown as JsonValue,
    [ENCODE_JSON_TEXT](jsonText) {
      const e = encrypt(jsonText);
      // Base64 needs no escaping: the same text JSON.stringify(e) gives, without scanning the ciphertext again.
      return `{"$enc":${idJson},"iv":"${e.iv}","tag":"${e.tag}","data":"${e.data}"}`;
    },
    decode(stored) {
      if (!isAesGcmEnvelope(stored)) return stored;
      const key = keys.get(stored.$enc);
      if (!key) {
        throw new PayloadKeyMissingError(
          `a stored payload is encrypted with key ${JSON.stringify(stored.$enc)}, which this codec does not have ` +
            `(its keys: ${[...keys.keys()].join(', ')}); configure every worker and client with every key still in use`,
          { details: { keyId: stored.$enc, keys: [...keys.keys()] } },
        );
      }
      const iv = Buffer.from(stored.iv, 'base64');
      const tag = Buffer.from(stored.tag, 'base64');
      const unreadable = (why: string, cause?: unknown) =>
        new PayloadUnreadableError(`a stored payload encrypted with key ${JSON.stringify(stored.$enc)} cannot be read: ${why}`, {
          ...(cause === undefined ? {} : { cause }),
          details: { keyId: stored.$enc },
        });
      if (iv.length !== IV_BYTES || tag.length !== TAG_BYTES) throw unreadable('its nonce or tag has the wrong length');
      let text: string;
      try {
        const decipher = createDecipheriv('aes-256-gcm', key, iv);
        decipher.setAuthTag(tag);
        text = Buffer.concat([decipher.update(Buffer.from(stored.data, 'base64')), decipher.final()]).toString('utf8');
      } catch (error) {
        throw unreadable(
          `it does not authenticate (changed since it was written, or key ${stored.$enc} is not the key it was written with)`,
          error,
        );
      }
      try {
        return JSON.parse(text) as JsonValue;
      } catch (error) {
        throw unreadable('its plaintext is not JSON', error);
      }
    },
  };
  return codec;
}
