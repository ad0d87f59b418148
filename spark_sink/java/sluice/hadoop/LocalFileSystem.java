package sluice.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local filesystem (checksums included) without a process per file.
 *
 * <p>Without Hadoop's native library (pyspark ships none), {@code RawLocalFileSystem} sets the
 * permission of every file and directory it creates by running {@code chmod} in a child
 * process: two per file written (the file and its {@code .crc}). Every Iceberg commit writes
 * two or three metadata files, so on a local warehouse most of the Spark drainer's JVM CPU per
 * batch was process creation (measured: ~9 ms per file created, 0.7 ms without the fork). Here
 * the same permission is set through java.nio in-process. The sticky, setuid and setgid bits
 * are not set (java.nio has no call for them; a warehouse's files never carry them).
 *
 * <p>Installed for the {@code file:} scheme by the Spark session
 * ({@code spark.hadoop.fs.file.impl}, spark_sink/session.py).
 */
public class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {

  public LocalFileSystem() {
    super(new Raw());
  }

  /** RawLocalFileSystem with an in-process chmod. */
  public static class Raw extends RawLocalFileSystem {
    private static final PosixFilePermission[] BITS = PosixFilePermission.values();

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      // PosixFilePermission's order is owner rwx, group rwx, others rwx: bit 8 down to bit 0.
      int mode = permission.toShort();
      Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
      for (int i = 0; i < 9; i++) {
        if ((mode & (1 << (8 - i))) != 0) {
          set.add(BITS[i]);
        }
      }
      Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
    }
  }
}
