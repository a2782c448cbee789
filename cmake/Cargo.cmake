# cargo_build_cdylib(TARGET <name> CRATE_DIR <dir> [PACKAGE <p>] LIBRARY <file> PROFILE <p> OUTPUT_VARIABLE <var>)
#
# Adds an always-run target that builds a Rust cdylib with cargo (cargo decides what is
# stale) and sets <var> to the built library's path.
find_program(CARGO_EXECUTABLE cargo HINTS "$ENV{HOME}/.cargo/bin" REQUIRED)

function(cargo_build_cdylib)
  cmake_parse_arguments(ARG "" "TARGET;CRATE_DIR;PACKAGE;LIBRARY;PROFILE;OUTPUT_VARIABLE" "" ${ARGN})
  if(ARG_PACKAGE)
    set(package_args -p "${ARG_PACKAGE}")
  else()
    set(package_args -p triton_rust)
  endif()
  # Share cargo's own target/ so `cargo build`/`cargo test` and cmake reuse one cache
  # (TRITON_RUST_CARGO_TARGET_DIR: another, e.g. for a build against another libtorch).
  if(TRITON_RUST_CARGO_TARGET_DIR)
    set(target_dir "${TRITON_RUST_CARGO_TARGET_DIR}")
  else()
    set(target_dir "${ARG_CRATE_DIR}/target")
  endif()
  if(ARG_PROFILE STREQUAL "dev")
    set(profile_dir debug)
  else()
    set(profile_dir "${ARG_PROFILE}")
  endif()
  set(lib "${target_dir}/${profile_dir}/${ARG_LIBRARY}")
  add_custom_target(${ARG_TARGET} ALL
    COMMAND "${CARGO_EXECUTABLE}" build --profile "${ARG_PROFILE}" --lib ${package_args}
            --manifest-path "${ARG_CRATE_DIR}/Cargo.toml" --target-dir "${target_dir}"
    BYPRODUCTS "${lib}"
    WORKING_DIRECTORY "${ARG_CRATE_DIR}"
    USES_TERMINAL
    COMMENT "cargo build --profile ${ARG_PROFILE} (${ARG_LIBRARY})")
  set(${ARG_OUTPUT_VARIABLE} "${lib}" PARENT_SCOPE)
endfunction()
