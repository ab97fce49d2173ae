/**
 * The type of a value after the JSON round trip every checkpoint, input, output and
 * signal payload goes through (`JSON.parse(JSON.stringify(value))`, after the checks of
 * core/json.ts). What `ctx.step` and the other context calls return, on the first
 * execution and on every replay alike, is `Jsonify<T>` of what the function produced:
 *
 * - a `Date` (any object with `toJSON`) becomes what `toJSON` returns: a string;
 * - properties holding functions, symbols or `undefined` are dropped (a property that
 *   may hold one becomes optional), so class instances lose their methods;
 * - `undefined` inside an array becomes `null`;
 * - arrays (readonly or not) and tuples keep their shape; like objects, they come back
 *   without `readonly` (a parsed value is a fresh, mutable copy);
 * - unions are mapped member by member;
 * - `bigint`, `Map` and `Set` are `never`: the engine refuses to store them
 *   (NOT_SERIALIZABLE) rather than let JSON turn a Map or Set into `{}`;
 * - `undefined` at the top stays `undefined` (a step that returns nothing).
 */
export type Jsonify<T> =
  IsAny<T> extends true
    ? any
    : unknown extends T
      ? unknown
      : T extends string | number | boolean | null | undefined | void
        ? T
        : T extends bigint | symbol | AnyFunction
          ? never
          : T extends { toJSON(...args: any[]): infer R }
            ? Jsonify<R>
            : T extends ReadonlyMap<unknown, unknown> | ReadonlySet<unknown> | WeakMap<object, unknown> | WeakSet<object>
              ? never
              : T extends readonly unknown[]
                ? JsonifyArray<T>
                : T extends object
                  ? JsonifyObject<T>
                  : never;

type IsAny<T> = 0 extends 1 & T ? true : false;

type AnyFunction = (...args: any[]) => unknown;

/** What JSON.stringify leaves out of an object. */
type Dropped = undefined | void | symbol | AnyFunction;

type JsonifyArray<T extends readonly unknown[]> = { -readonly [K in keyof T]: JsonifyItem<T[K]> };

type JsonifyItem<T> = IsAny<T> extends true ? any : T extends undefined | void ? null : Jsonify<T>;

/** Index signatures stay as they are; a property that can only be dropped is gone. */
type KeptKey<T, K extends keyof T> = K extends symbol
  ? never
  : string extends K
    ? K
    : number extends K
      ? K
      : [Exclude<T[K], Dropped>] extends [never]
        ? IsAny<T[K]> extends true
          ? K
          : never
        : K;

/** A property that is optional, or may hold something JSON drops, may be missing after the round trip. */
type MaybeMissing<T, K extends keyof T> = string extends K
  ? false
  : number extends K
    ? false
    : IsAny<T[K]> extends true
      ? false
      : // eslint-disable-next-line @typescript-eslint/no-empty-object-type -- the standard test for an optional key
        {} extends Pick<T, K>
        ? true
        : [Extract<T[K], Dropped>] extends [never]
          ? false
          : true;

type RequiredKeys<T> = { [K in keyof T]-?: KeptKey<T, K> extends never ? never : MaybeMissing<T, K> extends true ? never : K }[keyof T];
type OptionalKeys<T> = { [K in keyof T]-?: KeptKey<T, K> extends never ? never : MaybeMissing<T, K> extends true ? K : never }[keyof T];

type JsonifyObject<T extends object> = Simplify<
  { [K in RequiredKeys<T>]: Jsonify<Exclude<T[K], Dropped>> } & { [K in OptionalKeys<T>]?: Jsonify<Exclude<T[K], Dropped>> }
>;

type Simplify<T> = { [K in keyof T]: T[K] } & {};
