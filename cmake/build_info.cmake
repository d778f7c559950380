# Writes the build's identity (base/build_info.h) to OUT, run at every build by the
# baton_build_info_values target: the project's VERSION, the git commit of SOURCE_DIR ("-dirty"
# with uncommitted changes to tracked files; "unknown" outside a git checkout) and BUILD_TYPE.
# The file is rewritten only when one of them changed, so an unchanged tree rebuilds nothing.
set(commit "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE head_rc ERROR_QUIET)
  if(head_rc EQUAL 0 AND NOT head STREQUAL "")
    set(commit "${head}")
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} diff-index --quiet HEAD --
                    RESULT_VARIABLE dirty_rc ERROR_QUIET)
    if(NOT dirty_rc EQUAL 0)
      set(commit "${commit}-dirty")
    endif()
  endif()
endif()
if(BUILD_TYPE STREQUAL "")
  set(BUILD_TYPE "unspecified")
endif()
string(CONCAT text
  "// Written by cmake/build_info.cmake at build time.\n"
  "namespace baton::build_values {\n"
  "extern const char kVersion[] = \"${VERSION}\";\n"
  "extern const char kCommit[] = \"${commit}\";\n"
  "extern const char kBuildType[] = \"${BUILD_TYPE}\";\n"
  "}  // namespace baton::build_values\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
