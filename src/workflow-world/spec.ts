/**
 * The World spec version this World implements (@workflow/world 5.0.0-beta.21's
 * SPEC_VERSION_SUPPORTS_COMPRESSION): fixed here, not read from the installed @workflow/world,
 * so that a newer SDK sees what this World serves and a run written by a newer spec is refused
 * (RunNotSupportedError) rather than half understood.
 */
export const WORLD_SPEC_VERSION = 5;
