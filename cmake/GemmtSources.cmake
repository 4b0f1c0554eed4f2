# Reads sources.txt, the one list of gemmt's source files (python/gemmt/_sources.py reads the
# same file for the Python build routes; tests/test_sources.py checks that both agree).
#
#   gemmt_read_sources(<root> <prefix>)
# sets <prefix>_<group> in the caller's scope to the sorted absolute paths of each group
# (<prefix>_kernel_cuda, <prefix>_kernel_host, <prefix>_wrapper) and <prefix>_GROUPS to the
# group names. The globs carry CONFIGURE_DEPENDS, so a new file re-runs the configuration,
# and so does an edit of sources.txt itself.
#
# Script mode (what the test runs):
#   cmake -DGEMMT_SOURCE_ROOT=<root> -P cmake/GemmtSources.cmake
# prints "<group> <path relative to root>" per file.

# A script starts with every policy unset, and CMake 3.x then parses `IN_LIST` as an
# unknown argument (CMP0057); included from a project, the project's policies apply.
if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.24)
endif()
function(gemmt_read_sources root prefix)
  set(manifest "${root}/sources.txt")
  if(NOT EXISTS "${manifest}")
    message(FATAL_ERROR "gemmt: no source list at ${manifest}")
  endif()
  if(CMAKE_SCRIPT_MODE_FILE)
    set(depends "")
  else()
    set(depends CONFIGURE_DEPENDS)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${manifest}")
  endif()
  file(STRINGS "${manifest}" lines)
  set(groups "")
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    if(line STREQUAL "" OR line MATCHES "^#")
      continue()
    endif()
    if(NOT line MATCHES "^([A-Za-z_][A-Za-z0-9_]*)[ \t]+([^ \t]+)$")
      message(FATAL_ERROR "gemmt: ${manifest}: expected '<group> <pattern>', got '${line}'")
    endif()
    set(group "${CMAKE_MATCH_1}")
    set(pattern "${CMAKE_MATCH_2}")
    # "dir/**/name" is a recursive glob of "name" under dir; anything else is one folder.
    if(pattern MATCHES "^(([^*]*/)?)\\*\\*/([^/]+)$")
      file(GLOB_RECURSE found ${depends} "${root}/${CMAKE_MATCH_1}${CMAKE_MATCH_3}")
    elseif(pattern MATCHES "\\*\\*")
      message(FATAL_ERROR "gemmt: ${manifest}: '**' must be one folder component followed "
                          "by a file name pattern, got '${pattern}'")
    else()
      file(GLOB found ${depends} "${root}/${pattern}")
    endif()
    if(NOT group IN_LIST groups)
      list(APPEND groups "${group}")
      set(files_${group} "")
    endif()
    list(APPEND files_${group} ${found})
  endforeach()
  foreach(group IN LISTS groups)
    list(REMOVE_DUPLICATES files_${group})
    list(SORT files_${group})
    set(${prefix}_${group} "${files_${group}}" PARENT_SCOPE)
  endforeach()
  set(${prefix}_GROUPS "${groups}" PARENT_SCOPE)
endfunction()

#   gemmt_longest_first(<list variable> <root>)
# reorders a list of absolute source paths by cmake/compile_seconds.txt (one cold build's
# compile seconds a file, longest first; scripts/build_report.py --weights writes it): the
# listed files first, in its order, then the others in their own. Ninja (1.12 and later)
# starts the ready jobs that lie equally far from the end of the build in the order of the
# build file, which lists a target's objects in the order of its sources: a long file listed
# late starts late and ends the build alone.
function(gemmt_longest_first var root)
  set(table "${root}/cmake/compile_seconds.txt")
  if(NOT EXISTS "${table}")
    return()
  endif()
  if(NOT CMAKE_SCRIPT_MODE_FILE)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${table}")
  endif()
  file(STRINGS "${table}" lines REGEX "^[0-9]")
  set(first "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^[0-9.]+[ \t]+(.+)$")
      set(path "${root}/${CMAKE_MATCH_1}")
      if(path IN_LIST ${var})
        list(APPEND first "${path}")
      endif()
    endif()
  endforeach()
  set(rest ${${var}})
  if(first)
    list(REMOVE_ITEM rest ${first})
  endif()
  set(${var} ${first} ${rest} PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT GEMMT_SOURCE_ROOT)
    get_filename_component(GEMMT_SOURCE_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
  endif()
  gemmt_read_sources("${GEMMT_SOURCE_ROOT}" listed)
  foreach(group IN LISTS listed_GROUPS)
    foreach(file IN LISTS listed_${group})
      file(RELATIVE_PATH rel "${GEMMT_SOURCE_ROOT}" "${file}")
      message(NOTICE "${group} ${rel}")
    endforeach()
  endforeach()
endif()
